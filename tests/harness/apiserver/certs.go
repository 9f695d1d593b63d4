package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// identity is one client certificate the harness issues.
type identity struct {
	name string // file stem: admin, node-a, ...
	cn   string
	orgs []string
}

// runCerts writes the PKI, the token file and one kubeconfig per identity
// into --dir. Key material is generated only once per dir (when ca.crt is
// missing); kubeconfigs are rewritten on every run so --server can change.
func runCerts(args []string) error {
	fs := newFlagSet("certs")
	dir := fs.String("dir", "", "output directory (required)")
	nodes := fs.String("nodes", "node-a,node-b", "comma-separated node names; each gets CN=system:node:<name>, O=system:nodes")
	server := fs.String("server", "https://127.0.0.1:6443", "server URL written into the kubeconfigs")
	_ = fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	ids := []identity{{name: "admin", cn: "admin", orgs: []string{"system:masters"}}}
	for _, n := range strings.Split(*nodes, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		ids = append(ids, identity{name: n, cn: "system:node:" + n, orgs: []string{"system:nodes"}})
	}
	p := func(name string) string { return filepath.Join(*dir, name) }

	if _, err := os.Stat(p("ca.crt")); os.IsNotExist(err) {
		if err := generate(*dir, ids); err != nil {
			return err
		}
	} else {
		// Issue certs for identities added since the first run.
		if err := issueMissing(*dir, ids); err != nil {
			return err
		}
	}

	caPEM, err := os.ReadFile(p("ca.crt"))
	if err != nil {
		return err
	}
	for _, id := range ids {
		crt, err := os.ReadFile(p(id.name + ".crt"))
		if err != nil {
			return err
		}
		key, err := os.ReadFile(p(id.name + ".key"))
		if err != nil {
			return err
		}
		kc := kubeconfig(*server, caPEM, id.name, fmt.Sprintf(
			"    client-certificate-data: %s\n    client-key-data: %s\n",
			b64(crt), b64(key)))
		if err := writeFile(p("kubeconfig-"+id.name), kc, 0o600); err != nil {
			return err
		}
	}
	tok, err := os.ReadFile(p("token-a"))
	if err != nil {
		return err
	}
	kc := kubeconfig(*server, caPEM, "token", fmt.Sprintf("    token: %s\n", strings.TrimSpace(string(tok))))
	if err := writeFile(p("kubeconfig-token"), kc, 0o600); err != nil {
		return err
	}
	if err := writeFile(p("server"), []byte(*server+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Println(*dir)
	return nil
}

func generate(dir string, ids []identity) error {
	p := func(name string) string { return filepath.Join(dir, name) }
	now := time.Now().Add(-time.Hour)
	notAfter := now.Add(10 * 365 * 24 * time.Hour)

	// CA
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "nodeagent-test-ca"},
		NotBefore:             now,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	if err := writeCertKey(p("ca"), caDER, caKey); err != nil {
		return err
	}

	// apiserver serving cert
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, srvKey.Public(), caKey)
	if err != nil {
		return err
	}
	if err := writeCertKey(p("apiserver"), srvDER, srvKey); err != nil {
		return err
	}

	// service-account signing key (RSA)
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPriv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	saPub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})
	if err := writeFile(p("sa.key"), saPriv, 0o600); err != nil {
		return err
	}
	if err := writeFile(p("sa.pub"), saPub, 0o644); err != nil {
		return err
	}

	// static tokens
	tokens := map[string]string{"admin": randToken(), "token-a": randToken(), "token-b": randToken()}
	csv := fmt.Sprintf("%s,admin-token,admin-token-uid,\"system:masters\"\n", tokens["admin"]) +
		fmt.Sprintf("%s,token-user,token-user-uid,\"system:masters\"\n", tokens["token-a"]) +
		fmt.Sprintf("%s,token-user,token-user-uid,\"system:masters\"\n", tokens["token-b"])
	if err := writeFile(p("tokens.csv"), []byte(csv), 0o600); err != nil {
		return err
	}
	for name, t := range tokens {
		if err := writeFile(p("token-"+strings.TrimPrefix(name, "token-")), []byte(t+"\n"), 0o600); err != nil {
			return err
		}
	}
	return issueMissing(dir, ids)
}

// issueMissing issues a client cert for every identity without one.
func issueMissing(dir string, ids []identity) error {
	p := func(name string) string { return filepath.Join(dir, name) }
	caCert, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour)
	for _, id := range ids {
		if _, err := os.Stat(p(id.name + ".crt")); err == nil {
			continue
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: id.cn, Organization: id.orgs},
			NotBefore:    now,
			NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
		if err != nil {
			return err
		}
		if err := writeCertKey(p(id.name), der, key); err != nil {
			return err
		}
	}
	return nil
}

func loadCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	crtPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(crtPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("bad CA PEM in %s", dir)
	}
	crt, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return crt, key, nil
}

func writeCertKey(stem string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(stem+".crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeFile(stem+".key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}

func kubeconfig(server string, caPEM []byte, user, authLines string) []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: harness
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
%scontexts:
- name: %s
  context:
    cluster: harness
    user: %s
    namespace: default
current-context: %s
`, server, b64(caPEM), user, authLines, user, user, user))
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func randToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
