// Package testpki makes a throwaway certificate authority for the TLS tests:
// a CA, a server certificate for localhost and 127.0.0.1 signed by it, a
// client certificate signed by it, and a second, unrelated CA, all written
// as PEM files.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI names the PEM files in Dir.
type PKI struct {
	Dir string
	// CA is the authority's certificate; OtherCA one that signed nothing here.
	CA, OtherCA string
	// ServerCert and ServerKey are for localhost and 127.0.0.1.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate (CN wharf).
	ClientCert, ClientKey string
}

// New writes a fresh PKI into dir (created with mode 0755 if missing, so that
// a server running as another user can reach it; keys are 0600).
func New(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	caKey, caCert, caDER, err := authority("wharf test CA")
	if err != nil {
		return nil, err
	}
	_, _, otherDER, err := authority("unrelated CA")
	if err != nil {
		return nil, err
	}
	write := func(name string, blockType string, der []byte, mode os.FileMode) (string, error) {
		path := filepath.Join(dir, name)
		return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), mode)
	}
	if p.CA, err = write("ca.pem", "CERTIFICATE", caDER, 0o644); err != nil {
		return nil, err
	}
	if p.OtherCA, err = write("other-ca.pem", "CERTIFICATE", otherDER, 0o644); err != nil {
		return nil, err
	}
	leaf := func(name string, cn string, usage x509.ExtKeyUsage, server bool) (certPath, keyPath string, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", "", err
		}
		if certPath, err = write(name+".pem", "CERTIFICATE", der, 0o644); err != nil {
			return "", "", err
		}
		keyPath, err = write(name+"-key.pem", "PRIVATE KEY", keyDER, 0o600)
		return certPath, keyPath, err
	}
	if p.ServerCert, p.ServerKey, err = leaf("server", "localhost", x509.ExtKeyUsageServerAuth, true); err != nil {
		return nil, err
	}
	if p.ClientCert, p.ClientKey, err = leaf("client", "wharf", x509.ExtKeyUsageClientAuth, false); err != nil {
		return nil, err
	}
	return p, nil
}

// Chown hands the directory and every file to uid:gid (a server that runs as
// another user must own its key).
func (p *PKI) Chown(uid, gid int) error {
	return filepath.WalkDir(p.Dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// ServerTLS is a server configuration with the server certificate; with
// clientAuth it requires a client certificate signed by the CA.
func (p *PKI) ServerTLS(clientAuth bool) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientAuth {
		pem, err := os.ReadFile(p.CA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", p.CA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLS is a client configuration trusting the CA, with the client
// certificate.
func (p *PKI) ClientTLS() (*tls.Config, error) {
	pem, err := os.ReadFile(p.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

func authority(cn string) (*ecdsa.PrivateKey, *x509.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, der, err
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
