// Package tlsfiles builds a TLS client configuration from PEM files named in a
// sink URL: a CA bundle to verify the server with (instead of the system's
// roots) and a client certificate and key for servers that ask for one.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
)

// Files are the PEM files of a TLS client configuration; each may be empty.
type Files struct {
	// CA is a bundle of PEM certificates the server's chain must lead to;
	// empty means the system's roots.
	CA string
	// Cert and Key are the client's certificate chain and private key; both
	// or neither.
	Cert, Key string
}

// Any reports whether a file is named: naming one turns TLS on.
func (f Files) Any() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Set takes a URL option: name is one of the option names ca, cert and key
// map to (e.g. "tls_ca"), value the file. It reports whether name was one.
func (f *Files) Set(names [3]string, name, value string) bool {
	switch name {
	case names[0]:
		f.CA = value
	case names[1]:
		f.Cert = value
	case names[2]:
		f.Key = value
	default:
		return false
	}
	return true
}

// Config reads the files into a TLS configuration (TLS 1.2 or later, the
// server's name verified). names are the URL options' names, for errors.
func (f Files) Config(names [3]string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[0], unwrapPath(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in the file: give the CA's certificate in PEM form (-----BEGIN CERTIFICATE-----)", names[0], f.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert == "" && f.Key == "":
	case f.Cert == "" || f.Key == "":
		return nil, fmt.Errorf("%s and %s go together: give both the client certificate and its key", names[1], names[2])
	default:
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%s %s, %s %s: %w", names[1], f.Cert, names[2], f.Key, unwrapPath(err))
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// unwrapPath keeps an *os.PathError's path and reason on one line.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("cannot read %s: %w", pe.Path, pe.Err)
	}
	return err
}

// FromQuery reads the files from a URL's query, under names.
func FromQuery(q url.Values, names [3]string) Files {
	return Files{CA: q.Get(names[0]), Cert: q.Get(names[1]), Key: q.Get(names[2])}
}
