package bench

import "math"

// StudentTCDF is the cumulative distribution function of Student's t
// distribution with dof degrees of freedom (dof > 0, not necessarily an
// integer: an effective sample size rarely is).
func StudentTCDF(t, dof float64) float64 {
	if math.IsNaN(t) || dof <= 0 {
		return math.NaN()
	}
	if math.IsInf(t, 1) {
		return 1
	}
	if math.IsInf(t, -1) {
		return 0
	}
	// P(|T| > |t|) = I_x(dof/2, 1/2) with x = dof / (dof + t²).
	tail := 0.5 * regIncBeta(dof/2, 0.5, dof/(dof+t*t))
	if t > 0 {
		return 1 - tail
	}
	return tail
}

// StudentTQuantile returns t such that StudentTCDF(t, dof) = p, for
// 0 < p < 1, by bisection (the CDF is monotonic; 200 halvings reach the
// float64 resolution of any interval below 1e12).
func StudentTQuantile(p, dof float64) float64 {
	if p <= 0 || p >= 1 || dof <= 0 {
		return math.NaN()
	}
	if p == 0.5 {
		return 0
	}
	if p < 0.5 {
		return -StudentTQuantile(1-p, dof)
	}
	lo, hi := 0.0, 1.0
	for StudentTCDF(hi, dof) < p {
		lo, hi = hi, 2*hi
		if hi > 1e12 {
			return math.Inf(1)
		}
	}
	for range 200 {
		mid := (lo + hi) / 2
		if mid == lo || mid == hi {
			break
		}
		if StudentTCDF(mid, dof) < p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// regIncBeta is the regularized incomplete beta function I_x(a, b),
// evaluated with its continued fraction on the side where that converges
// quickly.
func regIncBeta(a, b, x float64) float64 {
	switch {
	case x <= 0:
		return 0
	case x >= 1:
		return 1
	}
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	front := math.Exp(a*math.Log(x) + b*math.Log1p(-x) - (la + lb - lab))
	if x < (a+1)/(a+b+2) {
		return front * betaContinuedFraction(a, b, x) / a
	}
	return 1 - front*betaContinuedFraction(b, a, 1-x)/b
}

// betaContinuedFraction evaluates the continued fraction of the incomplete
// beta function with the modified Lentz method.
func betaContinuedFraction(a, b, x float64) float64 {
	const tiny, eps = 1e-300, 1e-15
	guard := func(v float64) float64 {
		if math.Abs(v) < tiny {
			return tiny
		}
		return v
	}
	c := 1.0
	d := 1 / guard(1-(a+b)*x/(a+1))
	h := d
	for m := 1.0; m <= 1000; m++ {
		// Even step.
		num := m * (b - m) * x / ((a + 2*m - 1) * (a + 2*m))
		d = 1 / guard(1+num*d)
		c = guard(1 + num/c)
		h *= d * c
		// Odd step.
		num = -(a + m) * (a + b + m) * x / ((a + 2*m) * (a + 2*m + 1))
		d = 1 / guard(1+num*d)
		c = guard(1 + num/c)
		del := d * c
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h
}
