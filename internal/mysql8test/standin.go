package mysql8test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"
	"vitess.io/vitess/go/mysql/sqlerror"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/vtenv"
)

// The stand-in: vitess's MySQL server protocol (mysql.Listener: the
// handshake, TLS, caching_sha2_password and mysql_native_password,
// COM_QUERY, COM_REGISTER_SLAVE, COM_BINLOG_DUMP_GTID parsed into a GTID
// set) with a user, canned answers to the replication client's queries,
// and a binlog stream each test writes with vitess's event builders.

// Plugins says which login plugins the stand-in's user has, and which one
// its greeting names.
type Plugins struct {
	// Greeting is the plugin the greeting names (and the client answers
	// first): mysql.CachingSha2Password or mysql.MysqlNativePassword.
	Greeting mysql.AuthMethodDescription
	// Native and SHA2 are the plugins the user may log in with; the
	// server switches the client to the first of them when its answer was
	// for another.
	Native, SHA2 bool
}

// DumpRequest is a COM_BINLOG_DUMP_GTID the stand-in received.
type DumpRequest struct {
	// Set is the GTID set as vitess decoded it from the command's binary
	// form.
	Set replication.GTIDSet
	// Flags are the command's flags.
	Flags uint16
}

// Server is a MySQL 8 stand-in on a TCP port and a Unix socket.
type Server struct {
	// Addr is the TCP address (127.0.0.1:port); Socket the Unix socket's
	// path.
	Addr, Socket string
	// User and Password log in.
	User, Password string
	// Version is the version the greeting gives.
	Version string
	// Key is the RSA key of caching_sha2_password's exchange without TLS.
	Key *rsa.PrivateKey
	// Dumps receives each COM_BINLOG_DUMP_GTID.
	Dumps chan DumpRequest
	// Stream, set by a test, writes the binlog of a dump: the events
	// (Conn.WriteBinlogEvent), then returns (nil: the connection stays
	// open; an error: vitess sends it as an ERR packet).
	Stream func(c *mysql.Conn, req DumpRequest) error
	// Match, set by a test, answers the queries the canned answers do
	// not (false: no answer).
	Match func(q string) (*sqltypes.Result, bool)

	mu       sync.Mutex
	answers  map[string]*sqltypes.Result
	queries  []string
	cached   map[string]bool // the users caching_sha2_password's cache holds
	fullAuth int             // full authentications done
	rsaAuth  int             // RSA exchanges done
}

// Start starts a stand-in whose user has plugins, with TLS when tlsCfg is
// set, for the test's life.
func Start(t testing.TB, plugins Plugins, tlsCfg *tls.Config) *Server {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{User: "relay", Password: "s3cret-pw", Version: "8.0.36", Key: key,
		Dumps: make(chan DumpRequest, 16), cached: map[string]bool{},
		answers: map[string]*sqltypes.Result{
			"SELECT @@global.binlog_checksum": result("@@global.binlog_checksum", "CRC32"),
			"SELECT 1":                        result("1", "1"),
			"SELECT @@max_allowed_packet":     result("@@max_allowed_packet", "67108864"), // go-sql-driver asks
		}}
	auth := &authServer{def: plugins.Greeting}
	if plugins.SHA2 {
		// vitess's caching_sha2_password over TLS or the socket, the
		// stand-in's RSA exchange on a plain TCP connection.
		auth.methods = append(auth.methods, mysql.NewSha2CachingAuthMethod(s, s, s), &rsaMethod{s: s})
	}
	if plugins.Native {
		auth.methods = append(auth.methods, mysql.NewMysqlNativeAuthMethod(s, s))
	}
	h := &handler{s: s, env: vtenv.NewTestEnv()}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = tcp.Addr().String()
	s.Socket = filepath.Join(t.TempDir(), "mysql.sock")
	unix, err := net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	for _, nl := range []net.Listener{tcp, unix} {
		l, err := mysql.NewListenerWithConfig(mysql.ListenerConfig{Listener: nl, AuthServer: auth, Handler: h,
			ConnReadTimeout: time.Minute, ConnWriteTimeout: time.Minute, ConnReadBufferSize: 16 << 10,
			FlushDelay: mysql.DefaultFlushDelay})
		if err != nil {
			t.Fatal(err)
		}
		l.ServerVersion = s.Version
		if tlsCfg != nil {
			l.TLSConfig.Store(tlsCfg)
		}
		go l.Accept()
		t.Cleanup(l.Close)
	}
	return s
}

func result(name, value string) *sqltypes.Result {
	return sqltypes.MakeTestResult(sqltypes.MakeTestFields(name, "varchar"), value)
}

// Answer sets the stand-in's answer to the query q (its exact text).
func (s *Server) Answer(q string, res *sqltypes.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[q] = res
}

// Queries returns the queries received so far.
func (s *Server) Queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries...)
}

// Auths returns how many full authentications over a secure connection
// and RSA exchanges caching_sha2_password did.
func (s *Server) Auths() (full, rsa int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fullAuth, s.rsaAuth
}

// PublicKeyPEM is the server's RSA public key as MySQL sends it.
func (s *Server) PublicKeyPEM() []byte {
	der, err := x509.MarshalPKIXPublicKey(&s.Key.PublicKey)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

type authServer struct {
	def     mysql.AuthMethodDescription
	methods []mysql.AuthMethod
}

func (a *authServer) AuthMethods() []mysql.AuthMethod                           { return a.methods }
func (a *authServer) DefaultAuthMethodDescription() mysql.AuthMethodDescription { return a.def }

type userData struct{}

func (userData) Get() *querypb.VTGateCallerID { return &querypb.VTGateCallerID{Username: "relay"} }

func denied(user string) error {
	return sqlerror.NewSQLErrorf(sqlerror.ERAccessDeniedError, sqlerror.SSAccessDeniedError, "Access denied for user '%v'", user)
}

// HandleUser is the validator of vitess's auth methods: one user.
func (s *Server) HandleUser(user string) bool { return user == s.User }

// UserEntryWithHash checks a mysql_native_password answer with vitess's
// VerifyHashedMysqlNativePassword against SHA1(SHA1(password)).
func (s *Server) UserEntryWithHash(_ *mysql.Conn, salt []byte, user string, resp []byte, _ net.Addr) (mysql.Getter, error) {
	h1 := sha1.Sum([]byte(s.Password))
	h2 := sha1.Sum(h1[:])
	if user != s.User || !mysql.VerifyHashedMysqlNativePassword(resp, salt, h2[:]) {
		return nil, denied(user)
	}
	return userData{}, nil
}

// UserEntryWithCacheHash is caching_sha2_password's cache, as MySQL's: a
// user is in it once a full authentication succeeded; then vitess's
// VerifyHashedCachingSha2Password checks the fast answer against
// SHA256(SHA256(password)).
func (s *Server) UserEntryWithCacheHash(_ *mysql.Conn, salt []byte, user string, resp []byte, _ net.Addr) (mysql.Getter, mysql.CacheState, error) {
	s.mu.Lock()
	cached := s.cached[user]
	s.mu.Unlock()
	if user != s.User {
		return nil, mysql.AuthRejected, denied(user)
	}
	if !cached {
		return nil, mysql.AuthNeedMoreData, nil
	}
	h1 := sha256.Sum256([]byte(s.Password))
	h2 := sha256.Sum256(h1[:])
	if !mysql.VerifyHashedCachingSha2Password(resp, salt, h2[:]) {
		return nil, mysql.AuthRejected, nil
	}
	return userData{}, mysql.AuthAccepted, nil
}

// UserEntryWithPassword checks a password sent in full (over TLS or the
// socket), and caches the user.
func (s *Server) UserEntryWithPassword(_ *mysql.Conn, user, password string, _ net.Addr) (mysql.Getter, error) {
	if user != s.User || subtle.ConstantTimeCompare([]byte(password), []byte(s.Password)) != 1 {
		return nil, denied(user)
	}
	s.mu.Lock()
	s.cached[user] = true
	s.fullAuth++
	s.mu.Unlock()
	return userData{}, nil
}

// rsaMethod is caching_sha2_password on a connection without TLS, which
// vitess leaves out: the fast path from the cache, else MySQL's exchange
// (sql/auth/sha2_password.cc): "full authentication" (0x01 0x04), the
// client asks for the key (0x02), the server sends it (0x01, PEM), the
// client sends the password, NUL-terminated and XORed with the scramble,
// encrypted with RSA-OAEP (SHA-1).
type rsaMethod struct{ s *Server }

func (m *rsaMethod) Name() mysql.AuthMethodDescription { return mysql.CachingSha2Password }
func (m *rsaMethod) HandleUser(c *mysql.Conn, user string) bool {
	return !c.TLSEnabled() && !c.IsUnixSocket() && m.s.HandleUser(user)
}
func (m *rsaMethod) AllowClearTextWithoutTLS() bool { return true }

func (m *rsaMethod) AuthPluginData() ([]byte, error) {
	salt := make([]byte, 20)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	for i := range salt {
		salt[i] = salt[i]&0x7f | 1 // printable-ish, never NUL, as MySQL's
	}
	return append(salt, 0), nil
}

func (m *rsaMethod) HandleAuthPluginData(c *mysql.Conn, user string, serverData, clientData []byte, addr net.Addr) (mysql.Getter, error) {
	salt := serverData[:len(serverData)-1]
	g, state, err := m.s.UserEntryWithCacheHash(c, salt, user, clientData, addr)
	switch {
	case err != nil:
		return nil, err
	case state == mysql.AuthAccepted:
		if err := m.write(c, []byte{mysql.AuthMoreDataPacket, mysql.CachingSha2FastAuth}); err != nil {
			return nil, err
		}
		return g, nil
	case state == mysql.AuthRejected:
		return nil, denied(user)
	}
	if err := m.write(c, []byte{mysql.AuthMoreDataPacket, mysql.CachingSha2FullAuth}); err != nil {
		return nil, err
	}
	pkt, err := c.ReadPacket()
	if err != nil {
		return nil, err
	}
	if len(pkt) != 1 || pkt[0] != 2 {
		// Anything but a request for the key would be the password in
		// clear on a plain connection: MySQL refuses it.
		return nil, denied(user)
	}
	if err := m.write(c, append([]byte{mysql.AuthMoreDataPacket}, m.s.PublicKeyPEM()...)); err != nil {
		return nil, err
	}
	enc, err := c.ReadPacket()
	if err != nil {
		return nil, err
	}
	plain, err := rsa.DecryptOAEP(sha1.New(), nil, m.s.Key, enc, nil)
	if err != nil {
		return nil, denied(user)
	}
	for i := range plain {
		plain[i] ^= salt[i%len(salt)]
	}
	pw, ok := strings.CutSuffix(string(plain), "\x00")
	if !ok {
		return nil, denied(user)
	}
	g, err = m.s.UserEntryWithPassword(c, user, pw, addr)
	if err == nil {
		m.s.mu.Lock()
		m.s.rsaAuth++
		m.s.fullAuth--
		m.s.mu.Unlock()
	}
	return g, err
}

// write sends b as a packet (vitess's WritePacket takes the header's room
// before the payload).
func (m *rsaMethod) write(c *mysql.Conn, b []byte) error {
	if err := c.WritePacket(append(make([]byte, 4), b...)); err != nil {
		return err
	}
	return c.FlushWriteBuffer()
}

type handler struct {
	mysql.UnimplementedHandler
	s   *Server
	env *vtenv.Environment
}

func (h *handler) ComQuery(_ *mysql.Conn, q string, cb func(*sqltypes.Result) error) error {
	s := h.s
	s.mu.Lock()
	s.queries = append(s.queries, q)
	res, ok := s.answers[q]
	match := s.Match
	s.mu.Unlock()
	if !ok && match != nil {
		res, ok = match(q)
	}
	switch {
	case ok:
		return cb(res)
	case strings.HasPrefix(strings.ToUpper(q), "SET "), strings.HasPrefix(q, "use "): // vitess's own for the handshake's database
		return cb(&sqltypes.Result{})
	}
	// MySQL's parse error (1064), as a server older than a statement
	// answers it (SHOW BINARY LOG STATUS before 8.2).
	return sqlerror.NewSQLErrorf(sqlerror.ERParseError, sqlerror.SSClientError, "the stand-in has no answer to %q", q)
}

func (h *handler) ComQueryMulti(c *mysql.Conn, q string, cb func(sqltypes.QueryResponse, bool, bool) error) error {
	return h.ComQuery(c, q, func(r *sqltypes.Result) error { return cb(sqltypes.QueryResponse{QueryResult: r}, false, true) })
}

func (h *handler) ComPrepare(*mysql.Conn, string) ([]*querypb.Field, uint16, error) {
	return nil, 0, errors.New("the stand-in has no prepared statements")
}

func (h *handler) ComStmtExecute(*mysql.Conn, *mysql.PrepareData, func(*sqltypes.Result) error) error {
	return errors.New("the stand-in has no prepared statements")
}

func (h *handler) ComRegisterReplica(*mysql.Conn, string, uint16, string, string) error { return nil }

func (h *handler) ComBinlogDump(*mysql.Conn, string, uint32) error {
	return errors.New("the stand-in serves COM_BINLOG_DUMP_GTID only, as MySQL with gtid_mode=ON")
}

func (h *handler) ComBinlogDumpGTID(c *mysql.Conn, _ string, _ uint64, set replication.GTIDSet, flags uint16) error {
	req := DumpRequest{Set: set, Flags: flags}
	h.s.Dumps <- req
	if h.s.Stream == nil {
		return fmt.Errorf("the stand-in has no binlog to stream")
	}
	if err := h.s.Stream(c, req); err != nil {
		return err
	}
	return c.FlushWriteBuffer()
}

func (h *handler) WarningCount(*mysql.Conn) uint16 { return 0 }
func (h *handler) Env() *vtenv.Environment         { return h.env }
