package mysqlrepl

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
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
