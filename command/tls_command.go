package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/roamhq/roam/internal/tlsutil"
)

func init() {
	register("tls ca create", &Command{Synopsis: "Create a CA for the agents' TLS certificates", Run: runTLSCACreate})
	register("tls cert create", &Command{Synopsis: "Create a server, client or CLI certificate signed by the CA", Run: runTLSCertCreate})
}

// Default file names, in the current directory.
const (
	caCertFile = "roam-agent-ca.pem"
	caKeyFile  = "roam-agent-ca-key.pem"
)

const tlsCACreateUsage = `Usage: roam tls ca create [options]

  Creates a CA in the current directory: roam-agent-ca.pem (give it to
  every agent and CLI user as ca_file / -ca-cert) and roam-agent-ca-key.pem
  (keep it secret; it signs certificates). Existing files are not
  overwritten.
`

func runTLSCACreate(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("tls ca create", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, tlsCACreateUsage)
		fmt.Fprintln(errOut, "\nOptions:")
		fs.PrintDefaults()
	}
	days := fs.Int("days", 1825, "days the CA is valid for")
	cn := fs.String("common-name", "", "common name of the CA (default \"Roam Agent CA\")")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	if *days <= 0 {
		fmt.Fprintf(errOut, "Error creating CA: -days = %d must be positive\n", *days)
		return 1
	}
	cert, key, err := tlsutil.GenerateCA(tlsutil.CAOptions{Days: *days, CommonName: *cn})
	if err != nil {
		return fail(errOut, "creating CA", err)
	}
	if err := writeNew(caCertFile, cert, 0o644); err != nil {
		return fail(errOut, "creating CA", err)
	}
	if err := writeNew(caKeyFile, key, 0o600); err != nil {
		os.Remove(caCertFile)
		return fail(errOut, "creating CA", err)
	}
	fmt.Fprintf(out, "==> CA certificate saved to: %s\n==> CA certificate key saved to: %s\n", caCertFile, caKeyFile)
	return 0
}

const tlsCertCreateUsage = `Usage: roam tls cert create -server|-client|-cli [options]

  Creates a certificate and key signed by the CA, in the current directory,
  named <region>-<role>-roam.pem and <region>-<role>-roam-key.pem. A server
  certificate names server.<region>.roam, a client certificate
  client.<region>.roam, a CLI certificate cli.<region>.roam; agent
  certificates also name localhost and 127.0.0.1. Existing files are not
  overwritten.
`

func runTLSCertCreate(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("tls cert create", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, tlsCertCreateUsage)
		fmt.Fprintln(errOut, "\nOptions:")
		fs.PrintDefaults()
	}
	var (
		server, client, cli bool
		dnsNames, ips       stringList
	)
	fs.BoolVar(&server, "server", false, "create a server certificate")
	fs.BoolVar(&client, "client", false, "create a client certificate")
	fs.BoolVar(&cli, "cli", false, "create a certificate for the CLI")
	ca := fs.String("ca", caCertFile, "the CA certificate")
	caKey := fs.String("key", caKeyFile, "the CA's private key")
	region := fs.String("region", "global", "region the certificate is for")
	days := fs.Int("days", 365, "days the certificate is valid for")
	fs.Var(&dnsNames, "additional-dnsname", "another DNS name for the certificate (repeatable)")
	fs.Var(&ips, "additional-ipaddress", "another IP address for the certificate (repeatable)")
	if code, ok := parseNoArgs(fs, args, errOut); !ok {
		return code
	}
	var role string
	n := 0
	for r, on := range map[string]bool{tlsutil.RoleServer: server, tlsutil.RoleClient: client, tlsutil.RoleCLI: cli} {
		if on {
			role, n = r, n+1
		}
	}
	if n != 1 {
		fmt.Fprintln(errOut, "Error creating certificate: give exactly one of -server, -client or -cli")
		return 1
	}
	if *days <= 0 {
		fmt.Fprintf(errOut, "Error creating certificate: -days = %d must be positive\n", *days)
		return 1
	}
	var ipList []net.IP
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			fmt.Fprintf(errOut, "Error creating certificate: -additional-ipaddress %q is not an IP address\n", s)
			return 1
		}
		ipList = append(ipList, ip)
	}
	caPEM, err := os.ReadFile(*ca)
	if err != nil {
		return fail(errOut, "reading the CA certificate (run `roam tls ca create` first, or pass -ca)", err)
	}
	keyPEM, err := os.ReadFile(*caKey)
	if err != nil {
		return fail(errOut, "reading the CA key (pass -key)", err)
	}
	cert, key, err := tlsutil.GenerateCert(caPEM, keyPEM, tlsutil.CertOptions{
		Role: role, Region: *region, Days: *days, DNSNames: dnsNames, IPAddresses: ipList,
	})
	if err != nil {
		return fail(errOut, "creating certificate", err)
	}
	certFile := fmt.Sprintf("%s-%s-roam.pem", *region, role)
	keyFile := fmt.Sprintf("%s-%s-roam-key.pem", *region, role)
	if err := writeNew(certFile, cert, 0o644); err != nil {
		return fail(errOut, "creating certificate", err)
	}
	if err := writeNew(keyFile, key, 0o600); err != nil {
		os.Remove(certFile)
		return fail(errOut, "creating certificate", err)
	}
	fmt.Fprintf(out, "==> Using CA file %s and CA key %s\n==> %s certificate saved to: %s\n==> %s certificate key saved to: %s\n",
		*ca, *caKey, role, certFile, role, keyFile)
	return 0
}

// writeNew writes a file that must not exist yet.
func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s already exists; remove it or work in another directory", path)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}
