package mysqlrepl

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"
)

// scriptConn is the client's side of a connection to a server that sends
// script, then ends the connection (io.EOF), whatever the client writes,
// which it records.
type scriptConn struct {
	script  *bytes.Reader
	written bytes.Buffer
}

func (c *scriptConn) Read(b []byte) (int, error)       { return c.script.Read(b) }
func (c *scriptConn) Write(b []byte) (int, error)      { return c.written.Write(b) }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// handshakeWith runs the client's handshake against a server that sends
// script, and returns what the client sent and its error.
func handshakeWith(cfg Config, script []byte) ([]byte, error) {
	sc := &scriptConn{script: bytes.NewReader(script)}
	cfg = cfg.WithDefaults()
	c := &Conn{raw: sc, nc: sc, br: bufio.NewReaderSize(sc, 64<<10), cfg: cfg}
	err := c.handshake(cfg)
	return sc.written.Bytes(), err
}

// packet frames payload as a protocol packet of sequence number seq.
func packet(seq byte, payload []byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// greeting returns a MariaDB server greeting (handshake v10) offering
// caps.
func greeting(caps uint32) []byte {
	b := []byte{10}
	b = append(b, "10.11.19-MariaDB\x00"...)
	b = binary.LittleEndian.AppendUint32(b, 7) // connection id
	b = append(b, "abcdefgh"...)               // scramble, first part
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(caps))
	b = append(b, 45)
	b = binary.LittleEndian.AppendUint16(b, 2) // status
	b = binary.LittleEndian.AppendUint16(b, uint16(caps>>16))
	b = append(b, 21)
	b = append(b, make([]byte, 10)...)
	b = append(b, "ijklmnopqrst\x00"...) // scramble, second part
	return append(b, nativePassword+"\x00"...)
}

const serverCaps = capLongPassword | capLongFlag | capProtocol41 | capTransactions | capSecureConnection | capMultiResults | capPluginAuth

// fuzzUser is the user name of the handshake tests: with TLS asked for, it
// must never be sent in clear.
const fuzzUser = "idem-user-5e1f"

func handshakeConfig(withTLS bool) Config {
	cfg := Config{Addr: "127.0.0.1:3306", User: fuzzUser, Password: "secret", ServerID: 5}
	if withTLS {
		cfg.TLS = &tls.Config{ServerName: "db.example", MinVersion: tls.VersionTLS12}
	}
	return cfg
}

// TestHandshakeTLS checks what the client sends in clear when it asks for
// TLS: the SSL request (the handshake response's 32 bytes with CLIENT_SSL,
// no user), then a TLS ClientHello; nothing when the server does not offer
// TLS, or sends more than its greeting before the TLS handshake.
func TestHandshakeTLS(t *testing.T) {
	ok := packet(2, []byte{0, 0, 0, 2, 0, 0, 0})

	sent, err := handshakeWith(handshakeConfig(false), append(packet(0, greeting(serverCaps|capSSL)), ok...))
	if err != nil || !bytes.Contains(sent, []byte(fuzzUser)) {
		t.Fatalf("without TLS: %v, sent %q; want the handshake response with the user", err, sent)
	}

	sent, err = handshakeWith(handshakeConfig(true), packet(0, greeting(serverCaps|capSSL)))
	if err == nil || !strings.Contains(err.Error(), "TLS handshake with 127.0.0.1:3306") {
		t.Errorf("TLS against a server that ends the connection: %v, want a TLS handshake error", err)
	}
	if len(sent) < 36 || !bytes.Equal(sent[:4], []byte{32, 0, 0, 1}) || binary.LittleEndian.Uint32(sent[4:])&capSSL == 0 ||
		!bytes.Equal(sent[4+8+1:36], make([]byte, 23)) || sent[36] != 0x16 {
		t.Errorf("sent %x; want the SSL request (32 bytes, sequence 1, CLIENT_SSL) and a TLS handshake record", sent)
	}
	if bytes.Contains(sent, []byte(fuzzUser)) {
		t.Errorf("the user name was sent in clear: %q", sent)
	}

	sent, err = handshakeWith(handshakeConfig(true), append(packet(0, greeting(serverCaps)), ok...))
	if err == nil || !strings.Contains(err.Error(), "does not offer it") || len(sent) != 0 {
		t.Errorf("TLS against a server without it: %v, sent %q; want an error and nothing sent", err, sent)
	}
	sent, err = handshakeWith(handshakeConfig(true), append(packet(0, greeting(serverCaps|capSSL)), ok...))
	if err == nil || !strings.Contains(err.Error(), "more than its greeting") || len(sent) != 0 {
		t.Errorf("bytes before the TLS handshake: %v, sent %q; want an error and nothing sent", err, sent)
	}
}

// FuzzHandshake runs the client's handshake against a server that sends a
// fuzzed greeting, then fuzzed bytes: nothing may panic, and a client that
// asks for TLS never sends its user name in clear.
func FuzzHandshake(f *testing.F) {
	ok := packet(2, []byte{0, 0, 0, 2, 0, 0, 0})
	for _, caps := range []uint32{serverCaps, serverCaps | capSSL, capProtocol41} {
		for _, withTLS := range []bool{false, true} {
			f.Add(greeting(caps), ok, withTLS)
			f.Add(greeting(caps), packet(2, append([]byte{0xfe}, nativePassword+"\x00abcdefghijklmnopqrst\x00"...)), withTLS)
			f.Add(greeting(caps), packet(2, []byte{0xff, 0x15, 0x04, '#', '2', '8', '0', '0', '0', 'n', 'o'}), withTLS)
			f.Add(mysqlGreeting(caps, cachingSHA2Password), append(packet(2, []byte{1, sha2FullAuth}), packet(4, []byte("\x01-----BEGIN PUBLIC KEY-----\n"))...), withTLS)
			f.Add(mysqlGreeting(caps, cachingSHA2Password), append(packet(2, []byte{1, sha2FastAuthOK}), ok...), withTLS)
		}
	}
	f.Add([]byte{0xff, 0x10, 0x04, 't', 'o', 'o'}, []byte{}, false)
	f.Fuzz(func(t *testing.T, greet, rest []byte, withTLS bool) {
		sent, _ := handshakeWith(handshakeConfig(withTLS), append(packet(0, greet), rest...))
		if withTLS && bytes.Contains(sent, []byte(fuzzUser)) {
			t.Fatalf("TLS asked for, and the user name sent in clear: %q", sent)
		}
	})
}

// mysqlGreeting returns a MySQL 8 server greeting offering caps, whose
// default plugin is plugin.
func mysqlGreeting(caps uint32, plugin string) []byte {
	g := greeting(caps)
	g = bytes.Replace(g, []byte("10.11.19-MariaDB"), []byte("8.0.36"), 1)
	return append(bytes.TrimSuffix(g, []byte(nativePassword+"\x00")), plugin+"\x00"...)
}

// greetingScramble is the scramble of greeting and mysqlGreeting.
var greetingScramble = []byte("abcdefghijklmnopqrst")

// sentPackets splits what the client sent into its packets' payloads.
func sentPackets(t *testing.T, sent []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(sent) >= 4 {
		n := int(sent[0]) | int(sent[1])<<8 | int(sent[2])<<16
		if len(sent) < 4+n {
			t.Fatalf("a truncated packet: %x", sent)
		}
		out = append(out, sent[4:4+n])
		sent = sent[4+n:]
	}
	return out
}

// TestCachingSHA2 runs caching_sha2_password's paths against scripted
// servers: the fast path (the scramble MySQL checks:
// SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) + nonce)), full authentication
// over a secure connection (the password itself), and without one: an
// error unless AllowPublicKeyRetrieval, then the RSA key asked for and the
// password XORed with the scramble, encrypted with RSA-OAEP. The vitess
// tests of internal/mysql8test run the same paths against a server.
func TestCachingSHA2(t *testing.T) {
	cfg := handshakeConfig(false)
	ok := func(seq byte) []byte { return packet(seq, []byte{0, 0, 0, 2, 0, 0, 0}) }
	greet := packet(0, mysqlGreeting(serverCaps, cachingSHA2Password))

	sent, err := handshakeWith(cfg, bytes.Join([][]byte{greet, packet(2, []byte{1, sha2FastAuthOK}), ok(3)}, nil))
	if err != nil {
		t.Fatalf("fast path: %v", err)
	}
	h1 := sha256.Sum256([]byte(cfg.Password))
	h2 := sha256.Sum256(h1[:])
	h3 := sha256.Sum256(append(h2[:], greetingScramble...))
	want := make([]byte, 32)
	for i := range want {
		want[i] = h1[i] ^ h3[i]
	}
	resp := sentPackets(t, sent)[0]
	if !bytes.Contains(resp, append([]byte{32}, want...)) || !bytes.HasSuffix(resp, []byte(cachingSHA2Password+"\x00")) {
		t.Errorf("handshake response %x; want the SHA-256 scramble %x and the plugin's name", resp, want)
	}

	full := bytes.Join([][]byte{greet, packet(2, []byte{1, sha2FullAuth}), ok(4)}, nil)
	_, err = handshakeWith(cfg, full)
	if err == nil || !strings.Contains(err.Error(), "allowPublicKeyRetrieval=true") || strings.Contains(err.Error(), cfg.Password) {
		t.Errorf("full authentication without TLS: %v; want an error naming the ways out", err)
	}
	unix := cfg
	unix.Network, unix.Addr = "unix", "/tmp/mysql.sock"
	sent, err = handshakeWith(unix, full)
	if p := sentPackets(t, sent); err != nil || len(p) != 2 || string(p[1]) != cfg.Password+"\x00" {
		t.Errorf("full authentication over a Unix socket: %v, sent %q; want the password", err, p)
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	rsaCfg := cfg
	rsaCfg.AllowPublicKeyRetrieval = true
	sent, err = handshakeWith(rsaCfg, bytes.Join([][]byte{greet, packet(2, []byte{1, sha2FullAuth}), packet(4, append([]byte{1}, pemKey...)), ok(6)}, nil))
	p := sentPackets(t, sent)
	if err != nil || len(p) != 3 || !bytes.Equal(p[1], []byte{sha2RequestPublicKey}) {
		t.Fatalf("RSA exchange: %v, sent %q", err, p)
	}
	plain, err := rsa.DecryptOAEP(sha1.New(), nil, key, p[2], nil)
	if err != nil {
		t.Fatalf("the encrypted password: %v", err)
	}
	for i := range plain {
		plain[i] ^= greetingScramble[i%20]
	}
	if string(plain) != cfg.Password+"\x00" {
		t.Errorf("decrypted %q, want the password and a NUL", plain)
	}
	if bytes.Contains(sent, []byte(cfg.Password)) {
		t.Error("the password was sent in clear")
	}

	// A MariaDB-style greeting (mysql_native_password) switched to
	// caching_sha2_password by the server, and the reverse.
	sw := append([]byte{0xfe}, cachingSHA2Password+"\x00"...)
	sw = append(append(sw, "ABCDEFGHIJKLMNOPQRST"...), 0)
	sent, err = handshakeWith(cfg, bytes.Join([][]byte{packet(0, greeting(serverCaps)), packet(2, sw), packet(4, []byte{1, sha2FastAuthOK}), ok(5)}, nil))
	if p := sentPackets(t, sent); err != nil || len(p) != 2 || !bytes.Equal(p[1], scrambleSHA256([]byte("ABCDEFGHIJKLMNOPQRST"), cfg.Password)) {
		t.Errorf("switch to caching_sha2_password: %v, sent %x", err, p)
	}
	sw = append(append(append([]byte{0xfe}, nativePassword+"\x00"...), "ABCDEFGHIJKLMNOPQRST"...), 0)
	sent, err = handshakeWith(cfg, bytes.Join([][]byte{greet, packet(2, sw), ok(4)}, nil))
	if p := sentPackets(t, sent); err != nil || len(p) != 2 || !bytes.Equal(p[1], scramble([]byte("ABCDEFGHIJKLMNOPQRST"), cfg.Password)) {
		t.Errorf("switch to mysql_native_password: %v, sent %x", err, p)
	}
	sw = append(append([]byte{0xfe}, "sha256_password\x00"...), "ABCDEFGHIJKLMNOPQRST\x00"...)
	if _, err = handshakeWith(cfg, bytes.Join([][]byte{greet, packet(2, sw)}, nil)); err == nil || !strings.Contains(err.Error(), "sha256_password") {
		t.Errorf("switch to sha256_password: %v", err)
	}
}
