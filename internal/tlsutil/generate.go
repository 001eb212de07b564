package tlsutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Roles a generated certificate can be made for.
const (
	RoleServer = "server"
	RoleClient = "client"
	RoleCLI    = "cli"
)

// CAOptions shape a new CA.
type CAOptions struct {
	// Days the CA is valid for; 1825 when zero.
	Days int
	// CommonName of the CA; "Roam Agent CA" when empty.
	CommonName string
}

// GenerateCA makes a self-signed ECDSA P-256 CA and returns its
// certificate and private key as PEM.
func GenerateCA(o CAOptions) (certPEM, keyPEM []byte, err error) {
	if o.Days == 0 {
		o.Days = 1825
	}
	if o.Days < 0 {
		return nil, nil, fmt.Errorf("%w: days = %d must be positive", ErrConfig, o.Days)
	}
	if o.CommonName == "" {
		o.CommonName = "Roam Agent CA"
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generate ca key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	skid, err := keyID(key.Public())
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: o.CommonName, Organization: []string{"Roam"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.AddDate(0, 0, o.Days),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          skid,
		AuthorityKeyId:        skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: sign ca: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// CertOptions shape an agent or CLI certificate.
type CertOptions struct {
	// Role is RoleServer, RoleClient or RoleCLI; the certificate names
	// <role>.<region>.roam.
	Role   string
	Region string
	// Days the certificate is valid for; 365 when zero.
	Days int
	// NotBefore is when validity starts; now when zero. Tests set it in
	// the past to make an expired certificate.
	NotBefore time.Time
	// DNSNames and IPAddresses are added to the defaults (localhost and
	// 127.0.0.1 for agents).
	DNSNames    []string
	IPAddresses []net.IP
}

// GenerateCert makes a certificate for o signed by the CA, and returns it
// and its private key as PEM.
func GenerateCert(caCertPEM, caKeyPEM []byte, o CertOptions) (certPEM, keyPEM []byte, err error) {
	var name string
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	switch o.Role {
	case RoleServer:
		name = ServerName(o.Region)
	case RoleClient:
		name = ClientName(o.Region)
	case RoleCLI:
		name = CLIName(o.Region)
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	default:
		return nil, nil, fmt.Errorf("%w: role %q, want server, client or cli", ErrConfig, o.Role)
	}
	if o.Region == "" {
		return nil, nil, fmt.Errorf("%w: region is empty", ErrConfig)
	}
	if o.Days == 0 {
		o.Days = 365
	}
	if o.Days < 0 {
		return nil, nil, fmt.Errorf("%w: days = %d must be positive", ErrConfig, o.Days)
	}
	ca, caKey, err := parseCA(caCertPEM, caKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	start := o.NotBefore
	if start.IsZero() {
		start = time.Now().Add(-time.Minute)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    start,
		NotAfter:     start.AddDate(0, 0, o.Days),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		DNSNames:     append([]string{name, "localhost"}, o.DNSNames...),
		IPAddresses:  append([]net.IP{net.IPv4(127, 0, 0, 1)}, o.IPAddresses...),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: sign %s certificate: %w", o.Role, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%w: ca certificate is not PEM", ErrConfig)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: parse ca certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("%w: ca certificate is not a CA", ErrConfig)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%w: ca key is not PEM", ErrConfig)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		if ek, eerr := x509.ParseECPrivateKey(kb.Bytes); eerr == nil {
			k = ek
		} else {
			return nil, nil, fmt.Errorf("tls: parse ca key: %w", err)
		}
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%w: ca key cannot sign", ErrConfig)
	}
	return ca, signer, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("tls: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("tls: serial number: %w", err)
	}
	return n, nil
}

func keyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, errors.New("tls: marshal public key")
	}
	sum := sha256.Sum256(der)
	return sum[:20], nil
}
