package mysqlrepl

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// DialTimeoutDefault is Config.DialTimeout's default.
const DialTimeoutDefault = 10 * time.Second

// Config is what Dial needs.
type Config struct {
	// Network is "tcp" or "unix". Defaults to "tcp".
	Network string
	// Addr is host:port for tcp, the socket's path for unix. Required.
	Addr string
	// User and Password authenticate with mysql_native_password or
	// caching_sha2_password (MySQL 8's default), whichever the server
	// asks for. The user needs REPLICATION SLAVE (and REPLICATION CLIENT,
	// or BINLOG MONITOR on MariaDB, to read the server's position).
	User     string
	Password string
	// AllowPublicKeyRetrieval lets caching_sha2_password, when the
	// server's cache does not hold the password yet and the connection has
	// neither TLS nor a Unix socket, fetch the server's RSA public key and
	// send the password encrypted with it, as go-sql-driver's
	// allowPublicKeyRetrieval does. The key is not verified: a man in the
	// middle could replace it and read the password. Without it, such a
	// connection fails and says so; with TLS (or a Unix socket) the
	// password goes over the secure connection and the key is not needed.
	AllowPublicKeyRetrieval bool
	// ServerID is this replica's server_id, sent with the dump command.
	// Required (not 0); it must differ from the server's and from every
	// other replica's: the server ends an older dump connection that has
	// the same id.
	ServerID uint32
	// Heartbeat asks the server for a HeartbeatEvent when nothing was
	// written for that long (@master_heartbeat_period); 0: none. A reader
	// pairs it with SetDeadline to notice a dead connection.
	Heartbeat time.Duration
	// DialTimeout bounds the connection and the handshake. Defaults to
	// DialTimeoutDefault.
	DialTimeout time.Duration
	// TLS, when set, encrypts the connection: Dial asks the server for TLS
	// (the SSL request of the protocol) before it authenticates, and fails
	// if the server does not offer it. Its ServerName defaults to the host
	// of Addr, which the server's certificate must name unless
	// InsecureSkipVerify is set; its Certificates are presented to a
	// server that asks for a client certificate (a user created with
	// REQUIRE X509). Nil: no TLS.
	TLS *tls.Config
}

// WithDefaults returns cfg with the defaults of its zero fields.
func (cfg Config) WithDefaults() Config {
	if cfg.Network == "" {
		cfg.Network = "tcp"
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DialTimeoutDefault
	}
	return cfg
}

func (cfg Config) validate() error {
	switch {
	case cfg.Network != "tcp" && cfg.Network != "unix":
		return fmt.Errorf("idem: mysqlrepl: Config.Network %q: want tcp or unix", cfg.Network)
	case cfg.Addr == "":
		return errors.New("idem: mysqlrepl: Config.Addr is empty: give host:port or a socket path")
	case cfg.ServerID == 0:
		return errors.New("idem: mysqlrepl: Config.ServerID is 0: give this replica a server_id of its own")
	case cfg.Heartbeat < 0:
		return fmt.Errorf("idem: mysqlrepl: Config.Heartbeat %v is negative", cfg.Heartbeat)
	case cfg.DialTimeout < 0:
		return fmt.Errorf("idem: mysqlrepl: Config.DialTimeout %v is negative", cfg.DialTimeout)
	case cfg.TLS != nil && cfg.Network == "unix" && cfg.TLS.ServerName == "" && !cfg.TLS.InsecureSkipVerify:
		return errors.New("idem: mysqlrepl: Config.TLS over a Unix socket: set TLS.ServerName to a name the server's certificate holds")
	}
	return nil
}

// tlsConfig returns a copy of cfg.TLS with its ServerName, nil without TLS.
func (cfg Config) tlsConfig() *tls.Config {
	if cfg.TLS == nil {
		return nil
	}
	t := cfg.TLS.Clone()
	if t.ServerName == "" && cfg.Network == "tcp" {
		if host, _, err := net.SplitHostPort(cfg.Addr); err == nil {
			t.ServerName = host
		}
	}
	return t
}

// Conn is a replication connection to a MariaDB or MySQL server: a few statements
// (Exec), then StartDump and a stream of events (ReadEvent). It is not safe
// for concurrent use, except SetDeadline and Close, which may be called
// from another goroutine to interrupt a ReadEvent.
type Conn struct {
	// raw is the connection to the server; nc is where packets go: raw,
	// or the TLS connection over it. Deadlines and Close apply to raw, so
	// that another goroutine may call them while nc changes.
	raw     net.Conn
	nc      net.Conn
	br      *bufio.Reader
	seq     byte
	version string
	cfg     Config
	dumping bool
	broken  error // a read or write failed: the stream is out of step
	parser  Parser
}

// Capability flags of the client/server protocol.
const (
	capLongPassword     = 0x1
	capLongFlag         = 0x4
	capProtocol41       = 0x200
	capSSL              = 0x800
	capTransactions     = 0x2000
	capSecureConnection = 0x8000
	capMultiResults     = 0x20000
	capPluginAuth       = 0x80000
)

const (
	comQuit           = 0x01
	comQuery          = 0x03
	comBinlogDump     = 0x12
	comRegisterSlave  = 0x15
	comBinlogDumpGTID = 0x1e

	nativePassword      = "mysql_native_password"
	cachingSHA2Password = "caching_sha2_password"
	maxPayload          = 1<<24 - 1
	// maxPacket bounds what one logical packet (an event) may take:
	// MariaDB's max_allowed_packet limit (1 GiB) and a margin.
	maxPacket = 1<<30 + 1<<20
)

// Dial connects to the server and authenticates (handshake v10,
// mysql_native_password), over TLS when cfg.TLS is set (see Config.TLS).
// Without TLS the password's scramble and the events travel in clear: use
// it on a trusted network, a Unix socket or a tunnel. The whole of it is
// bounded by cfg.DialTimeout and ctx.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, cfg.Network, cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("idem: mysqlrepl: dial %s %s: %w", cfg.Network, cfg.Addr, err)
	}
	c := &Conn{raw: nc, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), cfg: cfg}
	stop := c.watch(ctx)
	err = c.handshake(cfg)
	stop()
	if err != nil {
		_ = nc.Close()
		return nil, ctxErr(ctx, "connect to "+cfg.Addr, err)
	}
	return c, nil
}

// ServerVersion returns the server's version ("10.11.6-MariaDB-0+deb12u1"),
// without the "5.5.5-" MariaDB 10 puts in front of it for old clients.
func (c *Conn) ServerVersion() string { return strings.TrimPrefix(c.version, "5.5.5-") }

// SetDeadline sets the deadline of the connection's reads and writes
// (net.Conn.SetDeadline); the zero time removes it. ReadEvent has no
// context: a deadline (renewed after each event, longer than the
// heartbeat) is how a reader notices a connection that died silently. An
// expired deadline breaks the Conn: close it and dial again.
func (c *Conn) SetDeadline(t time.Time) error { return c.raw.SetDeadline(t) }

// Close closes the connection (with COM_QUIT before StartDump). Called
// from another goroutine, it interrupts a ReadEvent in progress.
func (c *Conn) Close() error {
	if c.dumping {
		// Maybe called during a ReadEvent: touch nothing it uses.
		return c.raw.Close()
	}
	if c.broken == nil {
		c.seq = 0
		_ = c.raw.SetWriteDeadline(time.Now().Add(time.Second))
		_ = c.writePacket([]byte{comQuit})
	}
	return c.raw.Close()
}

// watch applies ctx to the connection until the returned function is
// called: its deadline, and an immediate deadline when it is canceled.
func (c *Conn) watch(ctx context.Context) (stop func()) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.raw.SetDeadline(dl)
	}
	done := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = c.raw.SetDeadline(time.Unix(1, 0))
	})
	return func() {
		if !stopAfter() {
			<-done
		}
		_ = c.raw.SetDeadline(time.Time{})
	}
}

// ctxErr returns err, or the context's error when ctx ended (the deadline
// error is then only its consequence).
func ctxErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("idem: mysqlrepl: %s: %w", op, context.Cause(ctx))
	}
	return err
}

func (c *Conn) handshake(cfg Config) error {
	pkt, err := c.readPacket()
	if err != nil {
		return err
	}
	if len(pkt) > 0 && pkt[0] == 0xff {
		return parseServerError(pkt)
	}
	if len(pkt) == 0 || pkt[0] != 10 {
		return errors.New("idem: mysqlrepl: the server's greeting is not protocol version 10: is it a MariaDB server?")
	}
	r := newReader(pkt[1:])
	c.version = cString(r, "server version")
	r.skip(4, "connection id")
	scr := append([]byte(nil), r.bytes(8, "auth data")...)
	r.skip(1, "filler")
	caps := uint32(r.u16("capabilities"))
	var authLen int
	if len(r.b) > 0 {
		r.skip(1, "charset")
		r.skip(2, "status")
		caps |= uint32(r.u16("capabilities")) << 16
		authLen = int(r.u8("auth data length"))
		r.skip(10, "reserved")
	}
	if err := r.err("server greeting"); err != nil {
		return fmt.Errorf("idem: mysqlrepl: %w", err)
	}
	if caps&capProtocol41 == 0 || caps&capSecureConnection == 0 {
		return errors.New("idem: mysqlrepl: the server does not speak protocol 4.1 with secure authentication: is it a MariaDB server?")
	}
	n := max(13, authLen-8)
	scr = append(scr, r.bytes(min(n, len(r.b)), "auth data")...)
	scr = bytes.TrimRight(scr, "\x00")
	if len(scr) < 20 {
		return fmt.Errorf("idem: mysqlrepl: the server's scramble has %d bytes, want 20", len(scr))
	}
	scr = scr[:20]
	plugin := nativePassword
	if caps&capPluginAuth != 0 && len(r.b) > 0 {
		plugin = cString(r, "auth plugin name")
	}
	if plugin != cachingSHA2Password {
		plugin = nativePassword // the client's choice: the server switches if it wants another
	}

	want := uint32(capLongPassword | capLongFlag | capProtocol41 | capTransactions | capSecureConnection | capMultiResults | capPluginAuth)
	secure := cfg.Network == "unix"
	if tc := cfg.tlsConfig(); tc != nil {
		if caps&capSSL == 0 {
			return fmt.Errorf("idem: mysqlrepl: TLS was asked for, but the server at %s (%s) does not offer it (have_ssl is not YES): give the server a certificate (ssl_cert, ssl_key and ssl_ca in its configuration) or connect without TLS", cfg.Addr, c.ServerVersion())
		}
		want |= capSSL
		if err := c.startTLS(want&caps, tc); err != nil {
			return err
		}
		secure = true
	}
	b := handshakeHeader(want & caps)
	b = append(b, cfg.User...)
	b = append(b, 0)
	auth := authResponse(plugin, scr, cfg.Password)
	b = append(b, byte(len(auth)))
	b = append(b, auth...)
	if caps&capPluginAuth != 0 {
		b = append(b, plugin...)
		b = append(b, 0)
	}
	if err := c.writePacket(b); err != nil {
		return err
	}
	return c.authenticate(cfg, plugin, scr, secure)
}

// authenticate reads the server's answers to the handshake response until
// its OK: an AuthSwitchRequest to mysql_native_password or
// caching_sha2_password (once), and the more-data packets of
// caching_sha2_password.
func (c *Conn) authenticate(cfg Config, plugin string, scr []byte, secure bool) error {
	switched, keyAsked := false, false
	for {
		pkt, err := c.readPacket()
		if err != nil {
			return err
		}
		if len(pkt) == 0 {
			return errors.New("idem: mysqlrepl: empty packet during authentication")
		}
		switch {
		case pkt[0] == 0x00:
			return nil
		case pkt[0] == 0xff:
			return parseServerError(pkt)
		case pkt[0] == 0xfe && !switched && len(pkt) > 1:
			// AuthSwitchRequest: plugin name, then its data.
			r := newReader(pkt[1:])
			plugin = cString(r, "plugin name")
			if plugin != nativePassword && plugin != cachingSHA2Password {
				return needPlugin(cfg.User, plugin)
			}
			data := bytes.TrimRight(r.b, "\x00")
			if len(data) < 20 {
				return fmt.Errorf("idem: mysqlrepl: the server's scramble has %d bytes, want 20", len(data))
			}
			scr = data[:20]
			if err := c.writePacket(authResponse(plugin, scr, cfg.Password)); err != nil {
				return err
			}
			switched = true
		case pkt[0] == 0x01 && plugin == cachingSHA2Password && keyAsked:
			// The server's RSA public key (PEM), asked for below.
			enc, err := encryptPassword(pkt[1:], scr, cfg.Password)
			if err != nil {
				return err
			}
			if err := c.writePacket(enc); err != nil {
				return err
			}
			keyAsked = false
		case pkt[0] == 0x01 && plugin == cachingSHA2Password && len(pkt) == 2 && pkt[1] == sha2FastAuthOK:
			// The scramble matched the server's cache: its OK follows.
		case pkt[0] == 0x01 && plugin == cachingSHA2Password && len(pkt) == 2 && pkt[1] == sha2FullAuth:
			// Not in the server's cache: the password itself, over TLS (or
			// a Unix socket), else encrypted with the server's RSA key.
			switch {
			case secure:
				err = c.writePacket(append([]byte(cfg.Password), 0))
			case !cfg.AllowPublicKeyRetrieval:
				return fmt.Errorf("idem: mysqlrepl: the server asks for the password of %q in full (caching_sha2_password, whose cache does not hold it yet), which this connection without TLS cannot send: connect with TLS (Config.TLS; sslmode=verify-full in the URL), or let the client fetch the server's RSA public key to encrypt it (Config.AllowPublicKeyRetrieval; allowPublicKeyRetrieval=true in the URL), which trusts the network not to replace the key", cfg.User)
			default:
				err = c.writePacket([]byte{sha2RequestPublicKey})
				keyAsked = true
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("idem: mysqlrepl: unexpected packet (%#x) during authentication with %s", pkt[0], plugin)
		}
	}
}

// The more-data packets of caching_sha2_password.
const (
	sha2RequestPublicKey = 0x02
	sha2FastAuthOK       = 0x03
	sha2FullAuth         = 0x04
)

// authResponse returns the answer of plugin to the scramble scr.
func authResponse(plugin string, scr []byte, password string) []byte {
	if plugin == cachingSHA2Password {
		return scrambleSHA256(scr, password)
	}
	return scramble(scr, password)
}

// scrambleSHA256 is caching_sha2_password's fast answer:
// SHA256(password) XOR SHA256(SHA256(SHA256(password)) + scramble).
func scrambleSHA256(scr []byte, password string) []byte {
	if password == "" {
		return nil
	}
	h1 := sha256.Sum256([]byte(password))
	h2 := sha256.Sum256(h1[:])
	h := sha256.New()
	h.Write(h2[:])
	h.Write(scr)
	out := h.Sum(nil)
	for i := range out {
		out[i] ^= h1[i]
	}
	return out
}

// encryptPassword encrypts the password, NUL-terminated and XORed with the
// scramble (repeated), with the server's RSA public key in PEM, as
// caching_sha2_password wants it without TLS: RSA-OAEP with SHA-1.
func encryptPassword(pemKey, scr []byte, password string) ([]byte, error) {
	block, _ := pem.Decode(pemKey)
	if block == nil {
		return nil, errors.New("idem: mysqlrepl: the server's public key is not PEM")
	}
	var pub *rsa.PublicKey
	switch block.Type {
	case "RSA PUBLIC KEY":
		k, err := x509.ParsePKCS1PublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("idem: mysqlrepl: the server's public key: %w", err)
		}
		pub = k
	default:
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("idem: mysqlrepl: the server's public key: %w", err)
		}
		rk, ok := k.(*rsa.PublicKey)
		if !ok {
			return nil, fmt.Errorf("idem: mysqlrepl: the server's public key is a %T, not RSA", k)
		}
		pub = rk
	}
	msg := append([]byte(password), 0)
	for i := range msg {
		msg[i] ^= scr[i%len(scr)]
	}
	out, err := rsa.EncryptOAEP(sha1.New(), rand.Reader, pub, msg, nil)
	if err != nil {
		return nil, fmt.Errorf("idem: mysqlrepl: encrypt the password with the server's public key: %w", err)
	}
	return out, nil
}

// handshakeHeader returns the start of the handshake response, which is
// also the whole SSL request: capabilities, largest packet, character set
// and 23 reserved bytes.
func handshakeHeader(caps uint32) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, caps)
	b = binary.LittleEndian.AppendUint32(b, maxPayload)
	b = append(b, 45) // utf8mb4_general_ci
	return append(b, make([]byte, 23)...)
}

// startTLS sends the SSL request (the handshake response's header with
// CLIENT_SSL, no credentials), then runs the TLS handshake: the rest of
// the conversation, credentials first, goes over TLS, the packets'
// sequence going on from the SSL request's.
func (c *Conn) startTLS(caps uint32, cfg *tls.Config) error {
	if c.br.Buffered() > 0 {
		// Bytes sent before the client spoke would be read as if they had
		// come over TLS.
		return errors.New("idem: mysqlrepl: the server sent more than its greeting before the TLS handshake")
	}
	if err := c.writePacket(handshakeHeader(caps)); err != nil {
		return err
	}
	tc := tls.Client(c.raw, cfg)
	if err := tc.Handshake(); err != nil {
		return c.fail(fmt.Errorf("idem: mysqlrepl: TLS handshake with %s: %w", c.cfg.Addr, err))
	}
	c.nc = tc
	c.br.Reset(tc)
	return nil
}

func needPlugin(user, plugin string) error {
	return fmt.Errorf("idem: mysqlrepl: the server authenticates %q with plugin %s; this client speaks mysql_native_password and caching_sha2_password: give the relay's user a password of one of them (MySQL: ALTER USER ... IDENTIFIED WITH caching_sha2_password BY '...'; MariaDB: ALTER USER ... IDENTIFIED VIA mysql_native_password USING PASSWORD('...'))", user, plugin)
}

// scramble is mysql_native_password's answer:
// SHA1(password) XOR SHA1(scramble + SHA1(SHA1(password))).
func scramble(scr []byte, password string) []byte {
	if password == "" {
		return nil
	}
	h1 := sha1.Sum([]byte(password))
	h2 := sha1.Sum(h1[:])
	h := sha1.New()
	h.Write(scr)
	h.Write(h2[:])
	out := h.Sum(nil)
	for i := range out {
		out[i] ^= h1[i]
	}
	return out
}

func cString(r *reader, what string) string {
	i := bytes.IndexByte(r.b, 0)
	if i < 0 {
		s := string(r.b)
		r.b = nil
		return s
	}
	s := string(r.b[:i])
	r.skip(i+1, what)
	return s
}

func parseServerError(pkt []byte) error {
	r := newReader(pkt[1:])
	e := &ServerError{Code: r.u16("error code")}
	if len(r.b) >= 6 && r.b[0] == '#' {
		e.State = string(r.b[1:6])
		r.b = r.b[6:]
	}
	e.Message = string(r.b)
	return e
}

// readPacket reads one logical packet, joining the 16 MiB pieces of a
// larger one.
func (c *Conn) readPacket() ([]byte, error) {
	if c.broken != nil {
		return nil, c.broken
	}
	var payload []byte
	for first := true; ; first = false {
		var hdr [4]byte
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			if first && errors.Is(err, io.EOF) {
				return nil, c.fail(fmt.Errorf("idem: mysqlrepl: the server closed the connection: %w", io.EOF))
			}
			return nil, c.fail(fmt.Errorf("idem: mysqlrepl: read: %w", err))
		}
		n := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
		if hdr[3] != c.seq {
			return nil, c.fail(fmt.Errorf("idem: mysqlrepl: packet sequence %d, want %d: the stream is out of step", hdr[3], c.seq))
		}
		c.seq++
		if len(payload)+n > maxPacket {
			return nil, c.fail(fmt.Errorf("idem: mysqlrepl: packet larger than %d bytes", maxPacket))
		}
		start := len(payload)
		payload = append(payload, make([]byte, n)...)
		if _, err := io.ReadFull(c.br, payload[start:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, c.fail(fmt.Errorf("idem: mysqlrepl: read: %w", err))
		}
		if n < maxPayload {
			return payload, nil
		}
	}
}

func (c *Conn) fail(err error) error {
	c.broken = err
	return err
}

// writePacket writes b as one logical packet, in 16 MiB pieces if larger.
func (c *Conn) writePacket(b []byte) error {
	if c.broken != nil {
		return c.broken
	}
	for {
		n := min(len(b), maxPayload)
		buf := make([]byte, 4, 4+n)
		buf[0], buf[1], buf[2], buf[3] = byte(n), byte(n>>8), byte(n>>16), c.seq
		c.seq++
		if _, err := c.nc.Write(append(buf, b[:n]...)); err != nil {
			return c.fail(fmt.Errorf("idem: mysqlrepl: write: %w", err))
		}
		b = b[n:]
		if n < maxPayload {
			return nil
		}
	}
}

func (c *Conn) command(b []byte) error {
	c.seq = 0
	return c.writePacket(b)
}

// Exec runs a statement that returns no rows (SET ...) and waits for its
// OK; a result set is read and discarded. It cannot be used after
// StartDump.
func (c *Conn) Exec(ctx context.Context, query string) error {
	_, err := c.query(ctx, query)
	return err
}

// query runs a statement and returns the rows of its result sets as text
// (nil for NULL).
func (c *Conn) query(ctx context.Context, query string) ([][]*string, error) {
	if c.dumping {
		return nil, errors.New("idem: mysqlrepl: Exec after StartDump: the connection only streams events now")
	}
	stop := c.watch(ctx)
	defer stop()
	rows, err := c.runQuery(query)
	if err != nil {
		return nil, ctxErr(ctx, "query", err)
	}
	return rows, nil
}

const serverMoreResults = 0x0008

func (c *Conn) runQuery(query string) ([][]*string, error) {
	if err := c.command(append([]byte{comQuery}, query...)); err != nil {
		return nil, err
	}
	var rows [][]*string
	for {
		pkt, err := c.readPacket()
		if err != nil {
			return nil, err
		}
		if len(pkt) == 0 {
			return nil, c.fail(errors.New("idem: mysqlrepl: empty packet in answer to a query"))
		}
		var status uint16
		switch pkt[0] {
		case 0x00: // OK: affected rows, last insert id, status
			r := newReader(pkt[1:])
			r.lenenc("affected rows")
			r.lenenc("insert id")
			status = r.u16("status")
		case 0xff:
			return nil, parseServerError(pkt)
		case 0xfb:
			return nil, c.fail(errors.New("idem: mysqlrepl: the server asks for a local file (LOAD DATA LOCAL): refused"))
		default: // a result set: column count, definitions, EOF, rows, EOF
			r := newReader(pkt)
			ncol := r.lenenc("column count")
			if !r.ok || ncol == 0 {
				return nil, c.fail(errors.New("idem: mysqlrepl: malformed result set header"))
			}
			for {
				pkt, err := c.readPacket()
				if err != nil {
					return nil, err
				}
				if isEOF(pkt) {
					break
				}
			}
			for {
				pkt, err := c.readPacket()
				if err != nil {
					return nil, err
				}
				if len(pkt) > 0 && pkt[0] == 0xff {
					return nil, parseServerError(pkt)
				}
				if isEOF(pkt) {
					status = binary.LittleEndian.Uint16(pkt[3:])
					break
				}
				row := make([]*string, 0, ncol)
				r := newReader(pkt)
				for range ncol {
					if len(r.b) > 0 && r.b[0] == 0xfb {
						r.b = r.b[1:]
						row = append(row, nil)
						continue
					}
					s := string(r.bytes(r.count("value length", len(r.b)), "value"))
					row = append(row, &s)
				}
				if !r.ok {
					return nil, c.fail(errors.New("idem: mysqlrepl: malformed row in a result set"))
				}
				rows = append(rows, row)
			}
		}
		if status&serverMoreResults == 0 {
			return rows, nil
		}
	}
}

func isEOF(pkt []byte) bool { return len(pkt) >= 5 && len(pkt) < 9 && pkt[0] == 0xfe }

// StartDump asks the server for its binlog from gtidPos and puts the
// connection in streaming mode: ReadEvent then returns the events. On
// MariaDB gtidPos is a GTID position, as Position.String writes it; on
// MySQL (a server whose version does not say MariaDB) a GTID set, as
// GTIDSet.String writes it (or @@global.gtid_executed), and the dump is
// COM_BINLOG_DUMP_GTID: the server sends every transaction not in the set
// (see startDumpMySQL). A set the server cannot serve (it purged some of
// what the set lacks, or the set holds transactions the server never had)
// is refused on the first ReadEvent with error 1236: see IsPurged.
//
// On MariaDB it sets @master_binlog_checksum to the server's binlog_checksum (the
// events come with their CRC32, which ReadEvent checks),
// @mariadb_slave_capability=4 (GTID events as they are),
// @slave_connect_state=gtidPos, @master_heartbeat_period with
// Config.Heartbeat, registers the replica (COM_REGISTER_SLAVE: SHOW SLAVE
// HOSTS lists it under its ServerID) and sends COM_BINLOG_DUMP. Strict
// GTID mode is not asked for.
//
// The dump starts after the last GTID of each domain of gtidPos; a domain
// gtidPos does not name starts at the beginning of the oldest binlog the
// server has: "" reads every binlog the server kept, which is rarely what a
// reader wants. A position the server cannot serve (purged, never written)
// is refused on the first ReadEvent with error 1236: see IsPurged.
func (c *Conn) StartDump(ctx context.Context, gtidPos string) error {
	if c.dumping {
		return errors.New("idem: mysqlrepl: StartDump called twice: dial a new connection")
	}
	var stmts []string
	var dump []byte
	if c.MariaDB() {
		pos, err := ParsePosition(gtidPos)
		if err != nil {
			return err
		}
		stmts = []string{
			"SET @master_binlog_checksum = @@global.binlog_checksum",
			"SET @mariadb_slave_capability = 4",
			"SET @slave_connect_state = '" + pos.String() + "'",
		}
		if c.cfg.Heartbeat > 0 {
			stmts = append(stmts, fmt.Sprintf("SET @master_heartbeat_period = %d", c.cfg.Heartbeat.Nanoseconds()))
		}
		dump = append(dump, comBinlogDump)
		dump = binary.LittleEndian.AppendUint32(dump, 4) // position: ignored with a GTID connect state
		dump = binary.LittleEndian.AppendUint16(dump, 0) // flags: block at the end of the binlog
		dump = binary.LittleEndian.AppendUint32(dump, c.cfg.ServerID)
	} else {
		set, err := ParseGTIDSet(gtidPos)
		if err != nil {
			return err
		}
		stmts, dump = c.mysqlDump(set)
	}
	checksum, err := c.checksum(ctx)
	if err != nil {
		return err
	}
	for _, s := range stmts {
		if err := c.Exec(ctx, s); err != nil {
			return fmt.Errorf("idem: mysqlrepl: %s: %w", s, err)
		}
	}
	stop := c.watch(ctx)
	defer stop()
	if err := c.registerSlave(); err != nil {
		return ctxErr(ctx, "register as a replica", fmt.Errorf("idem: mysqlrepl: register as a replica: %w", err))
	}
	if err := c.command(dump); err != nil {
		return ctxErr(ctx, "start the dump", err)
	}
	c.dumping = true
	c.parser = Parser{checksum: checksum}
	return nil
}

// MariaDB reports whether the server is MariaDB, as its version says;
// otherwise it is taken for MySQL.
func (c *Conn) MariaDB() bool { return strings.Contains(c.version, "MariaDB") }

// checksum reads the server's binlog_checksum.
func (c *Conn) checksum(ctx context.Context) (checksumMode, error) {
	rows, err := c.query(ctx, "SELECT @@global.binlog_checksum")
	if err != nil {
		return 0, fmt.Errorf("idem: mysqlrepl: read binlog_checksum: %w", err)
	}
	checksum := checksumUnknown
	if len(rows) == 1 && len(rows[0]) == 1 && rows[0][0] != nil {
		switch *rows[0][0] {
		case "CRC32":
			checksum = checksumOn
		case "NONE":
			checksum = checksumOff
		}
	}
	return checksum, nil
}

// binlogThroughGTID is the flag of COM_BINLOG_DUMP_GTID saying that the
// position is a GTID set (MySQL's own replicas set it).
const binlogThroughGTID = 0x04

// mysqlDump returns the statements and the dump command of StartDump on
// MySQL: @source_binlog_checksum (and @master_binlog_checksum, its name
// before 8.0.26), the heartbeat period, then COM_BINLOG_DUMP_GTID with set
// in its binary form. The server sends every transaction the set does not
// hold, from the oldest binlog that has one.
func (c *Conn) mysqlDump(set GTIDSet) ([]string, []byte) {
	stmts := []string{
		"SET @source_binlog_checksum = @@global.binlog_checksum",
		"SET @master_binlog_checksum = @@global.binlog_checksum",
	}
	if c.cfg.Heartbeat > 0 {
		ns := c.cfg.Heartbeat.Nanoseconds()
		stmts = append(stmts, fmt.Sprintf("SET @source_heartbeat_period = %d", ns), fmt.Sprintf("SET @master_heartbeat_period = %d", ns))
	}
	data := set.Encode()
	var b []byte
	b = append(b, comBinlogDumpGTID)
	b = binary.LittleEndian.AppendUint16(b, binlogThroughGTID)
	b = binary.LittleEndian.AppendUint32(b, c.cfg.ServerID)
	b = binary.LittleEndian.AppendUint32(b, 0) // binlog file name: none
	b = binary.LittleEndian.AppendUint64(b, 4) // position: ignored with a GTID set
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	return stmts, append(b, data...)
}

func (c *Conn) registerSlave() error {
	var b []byte
	b = append(b, comRegisterSlave)
	b = binary.LittleEndian.AppendUint32(b, c.cfg.ServerID)
	b = append(b, 0, 0, 0)                     // host, user, password: empty
	b = binary.LittleEndian.AppendUint16(b, 0) // port
	b = binary.LittleEndian.AppendUint32(b, 0) // replication rank
	b = binary.LittleEndian.AppendUint32(b, 0) // master id
	if err := c.command(b); err != nil {
		return err
	}
	pkt, err := c.readPacket()
	if err != nil {
		return err
	}
	if len(pkt) > 0 && pkt[0] == 0xff {
		return parseServerError(pkt)
	}
	if len(pkt) == 0 || pkt[0] != 0x00 {
		return c.fail(errors.New("idem: mysqlrepl: unexpected answer to COM_REGISTER_SLAVE"))
	}
	return nil
}

// ReadEvent blocks until the server sends the next event and returns it
// decoded (see Parser). It checks every event's CRC32 when the binlog has
// them (the FORMAT_DESCRIPTION_EVENT says so): a mismatch returns an error
// wrapping ErrChecksum with the binlog file and position. An ERR from the
// server returns a *ServerError (1236 on the first call when the position
// is unavailable: IsPurged); the server closing the connection returns an
// error wrapping io.EOF. After an error other than a decoding one
// (ErrMalformed, ErrUnsupported, ErrChecksum), the Conn is done: close it.
// It has no context: use SetDeadline, or Close from another goroutine.
func (c *Conn) ReadEvent() (Event, error) {
	if !c.dumping {
		return nil, errors.New("idem: mysqlrepl: ReadEvent before StartDump")
	}
	pkt, err := c.readPacket()
	if err != nil {
		return nil, err
	}
	switch {
	case len(pkt) > 0 && pkt[0] == 0x00:
		return c.parser.Parse(pkt[1:])
	case len(pkt) > 0 && pkt[0] == 0xff:
		return nil, c.fail(parseServerError(pkt))
	case isEOF(pkt):
		return nil, c.fail(fmt.Errorf("idem: mysqlrepl: the server ended the dump: %w", io.EOF))
	}
	return nil, c.fail(errors.New("idem: mysqlrepl: unexpected packet in the binlog stream"))
}

// Parser returns the Conn's parser: its current binlog file and table maps.
func (c *Conn) Parser() *Parser { return &c.parser }
