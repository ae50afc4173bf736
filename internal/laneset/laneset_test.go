package laneset

import "testing"

func TestRanges(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{
		{nil, ""},
		{[]int{5}, "5"},
		{[]int{63, 40, 62, 0, 1, 2, 3}, "0-3,40,62-63"},
		{[]int{1, 3, 5}, "1,3,5"},
	} {
		if got := Ranges(c.in); got != c.want {
			t.Errorf("Ranges(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
