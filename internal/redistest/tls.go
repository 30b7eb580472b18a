package redistest

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

// certValidity is how long the generated certificates are valid, from an
// hour before they are made (to tolerate clock skew).
const certValidity = 24 * time.Hour

// TLSOptions makes a server started by Start speak TLS only (--port 0,
// --tls-port on the chosen port), with a certificate authority and
// certificates that Start generates in t.TempDir().
type TLSOptions struct {
	// AuthClients requires every client to present a certificate signed by
	// the CA (--tls-auth-clients yes). False does not ask clients for one
	// (--tls-auth-clients no).
	AuthClients bool
}

// TLSFiles are the PEM files of a TLS server started by Start: a
// self-signed CA, the server certificate it signed (for 127.0.0.1 and
// localhost) and a client certificate it signed. The keys are ECDSA P-256,
// PKCS #8, unencrypted.
type TLSFiles struct {
	// CA is the CA certificate, for --tls-ca-cert-file and clients' root
	// pool.
	CA string
	// ServerCert and ServerKey are the server's certificate and key.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are a client certificate and its key, which
	// the server accepts when TLSOptions.AuthClients is set.
	ClientCert, ClientKey string
}

// newTLSFiles writes a fresh CA, server and client certificate and keys
// into dir, and returns their paths and a client configuration that trusts
// the CA and presents the client certificate.
func newTLSFiles(dir string) (TLSFiles, *tls.Config, error) {
	f := TLSFiles{
		CA:         filepath.Join(dir, "ca.crt"),
		ServerCert: filepath.Join(dir, "server.crt"),
		ServerKey:  filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"),
		ClientKey:  filepath.Join(dir, "client.key"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, nil, err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTmpl, caTmpl, caKey, caKey, f.CA, "")
	if err != nil {
		return f, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, nil, err
	}
	leaf := func(cn string, usage x509.ExtKeyUsage, certPath, keyPath string) (*ecdsa.PrivateKey, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: cn},
			NotBefore:   now.Add(-time.Hour),
			NotAfter:    now.Add(certValidity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := sign(tmpl, ca, key, caKey, certPath, keyPath)
		return key, der, err
	}
	if _, _, err := leaf("redistest server", x509.ExtKeyUsageServerAuth, f.ServerCert, f.ServerKey); err != nil {
		return f, nil, err
	}
	clientKey, clientDER, err := leaf("redistest client", x509.ExtKeyUsageClientAuth, f.ClientCert, f.ClientKey)
	if err != nil {
		return f, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	conf := &tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{{Certificate: [][]byte{clientDER}, PrivateKey: clientKey}},
		MinVersion:   tls.VersionTLS12,
	}
	return f, conf, nil
}

// sign makes the certificate tmpl for key, signed by parent with
// parentKey, writes it to certPath and, if keyPath is not empty, key to
// keyPath, as PEM. It returns the certificate's DER.
func sign(tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey, certPath, keyPath string) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if keyPath == "" {
		return der, nil
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return der, writePEM(keyPath, "PRIVATE KEY", keyDER)
}

// writePEM writes one PEM block to path, readable by its owner only.
func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
