// Package embedded runs a NATS server with JetStream inside the process, its
// data in a directory, so that an idem application needs no broker installed.
// Messages survive a restart of the process: start a server on the same
// directory and it finds its streams, consumers and unacknowledged messages.
//
//	srv, err := embedded.Start(ctx, embedded.Config{Dir: "data/nats"})
//	...
//	defer srv.Shutdown(ctx)
//	nc, err := srv.Connect()
//	pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{Conn: nc}})
//
// By default the server accepts in-process connections only; set Listen
// (127.0.0.1:4222) to let other processes, such as the idem command, connect
// with nats://127.0.0.1:4222. Only one server may use a directory at a time:
// Start locks it (a lock file, LockFile, held until Shutdown or the end of
// the process, whatever ends it) and refuses a directory another server
// holds with ErrDirInUse.
package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/idem-go/idem/internal/dirlock"
)

// LockFile is the file in the store directory that a running server holds
// locked (flock), with its process id in it.
const LockFile = "idem.lock"

// ErrDirInUse is wrapped by the error of Start, and of CheckDir, when
// another server holds the store directory, in this process or another:
// two servers on one JetStream store corrupt it. The error names the
// holder's process id.
var ErrDirInUse = errors.New("idem: nats embedded: another server holds the store directory")

// CheckDir returns an error wrapping ErrDirInUse when a server holds dir,
// as Start would, without starting one: a process that will start a server
// there can stop before it opens anything else.
func CheckDir(dir string) error {
	return dirInUse(dirlock.Check(dir, LockFile))
}

// dirInUse turns dirlock's refusal into ErrDirInUse.
func dirInUse(err error) error {
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%w: %w; stop that process, or use another directory", ErrDirInUse, held)
	}
	return err
}

// Defaults of Config.
const (
	// ServerNameDefault is the server name. JetStream stores a server's data
	// by name, so a restarted server must keep it.
	ServerNameDefault = "idem-embedded"
	// StartTimeoutDefault bounds the wait for the server to accept
	// connections.
	StartTimeoutDefault = 30 * time.Second
)

// Config configures an embedded server.
type Config struct {
	// Dir is the JetStream store directory, created if missing. Required.
	Dir string
	// Listen is the host:port the server listens on for clients, for
	// example "127.0.0.1:4222", or "127.0.0.1:0" for a free port. Empty
	// means no network listener: only in-process connections (Connect).
	Listen string
	// ServerName names the server; keep it across restarts. Defaults to
	// "idem-embedded".
	ServerName string
	// SyncAlways makes JetStream write and sync each message to disk before
	// acknowledging it, so that an acknowledged message survives a crash of
	// the machine. Without it, a message is written within a few
	// milliseconds and synced every two minutes: a crash of the process can
	// lose what was acknowledged in the last milliseconds, a crash of the
	// machine the last two minutes, although a relay has already marked
	// those messages published. Applications that use the embedded server
	// as their broker should set it (the shop does, by default).
	SyncAlways bool
	// MaxStore caps the disk space of JetStream, in bytes. Defaults to the
	// size of the file system holding Dir: the disk itself is the limit (the
	// server's own default, the space free at start, would refuse messages
	// for good after a start on a nearly full disk).
	MaxStore int64
	// StartTimeout bounds the wait for the server to be ready. Defaults to
	// 30s.
	StartTimeout time.Duration
	// Logger receives the server's warnings and errors (notices at debug
	// level). Nil logs nothing.
	Logger *slog.Logger
}

// RecoverEveryDefault is how often a server whose JetStream was disabled
// tries to enable it again.
const RecoverEveryDefault = time.Second

// Server is a running embedded NATS server.
type Server struct {
	cfg  Config
	dir  string
	ns   *server.Server
	quit chan struct{}
	done chan struct{}
	stop sync.Once
	// writeFailed is set when JetStream failed to write to disk: a
	// file store keeps that error and refuses every later write.
	writeFailed atomic.Bool
	// lock holds the directory until the server has shut down.
	lock *dirlock.Lock
	// maxMemory is JetStream's memory limit, as the server chose it.
	maxMemory int64
}

// Start starts a server with JetStream on cfg.Dir and waits until it accepts
// connections.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("idem: nats embedded: Config.Dir is required (the JetStream store directory)")
	}
	cfg.ServerName = cmp.Or(cfg.ServerName, ServerNameDefault)
	cfg.StartTimeout = cmp.Or(cfg.StartTimeout, StartTimeoutDefault)
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("idem: nats embedded: Config.Dir %q: %w", cfg.Dir, err)
	}
	lock, err := dirlock.Acquire(dir, LockFile)
	if err != nil {
		if errors.Is(err, dirlock.ErrHeld) {
			return nil, dirInUse(err)
		}
		return nil, fmt.Errorf("idem: nats embedded: %w", err)
	}
	srv, err := start(ctx, cfg, dir)
	if err != nil {
		_ = lock.Release()
		return nil, err
	}
	srv.lock = lock
	return srv, nil
}

// start starts the server of Start on dir, which it holds.
func start(ctx context.Context, cfg Config, dir string) (*Server, error) {
	if cfg.MaxStore == 0 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err == nil {
			cfg.MaxStore = int64(st.Blocks) * int64(st.Bsize)
		}
	}
	opts := &server.Options{
		ServerName:        cfg.ServerName,
		JetStream:         true,
		StoreDir:          dir,
		SyncAlways:        cfg.SyncAlways,
		JetStreamMaxStore: cfg.MaxStore,
		NoSigs:            true,
		NoSystemAccount:   true,
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("idem: nats embedded: Config.Listen %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, fmt.Errorf("idem: nats embedded: Config.Listen %q: bad port", cfg.Listen)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Host, opts.Port = cmp.Or(host, "127.0.0.1"), p
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("idem: nats embedded: %w", err)
	}
	srv := &Server{cfg: cfg, dir: dir, ns: ns, quit: make(chan struct{}), done: make(chan struct{})}
	ns.SetLoggerV2(slogLogger{l: cfg.Logger, writeFailed: func() { srv.writeFailed.Store(true) }}, false, false, false)
	go ns.Start()
	deadline := cfg.StartTimeout
	if d, ok := ctx.Deadline(); ok {
		deadline = min(deadline, time.Until(d))
	}
	if !ns.ReadyForConnections(deadline) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("idem: nats embedded: server on %s not ready after %v", dir, deadline)
	}
	if jc := ns.JetStreamConfig(); jc != nil {
		srv.maxMemory = jc.MaxMemory
	}
	go srv.recoverJetStream(RecoverEveryDefault)
	return srv, nil
}

// minFreeToRecover is the free disk space the server waits for before it
// restarts JetStream after a write failure.
const minFreeToRecover = 4 << 20

// recoverJetStream restarts JetStream after a write to disk failed, once
// space is back, and enables it again if the server disabled it. When a disk
// fills up, a NATS server's file store keeps the write error and refuses
// every later message of the stream, without an answer (publishes time out),
// until the process restarts; on some errors the server disables JetStream
// instead. Restarting JetStream reloads the streams and consumers from disk,
// with every message acknowledged before the failure.
func (s *Server) recoverJetStream(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	var failures int
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		failed, enabled := s.writeFailed.Load(), s.ns.JetStreamEnabled()
		if (!failed && enabled) || !s.ns.Running() {
			continue
		}
		if free := s.free(); free < minFreeToRecover {
			if failures%30 == 0 {
				s.logger().Error("nats embedded: JetStream cannot write to disk; waiting for free space, publishes fail until then",
					"dir", s.dir, "free_bytes", free)
			}
			failures++
			continue
		}
		s.writeFailed.Store(false)
		if enabled {
			if err := s.ns.ShutdownJetStream(); err != nil {
				s.logger().Error("nats embedded: stop JetStream after a write failure", "error", err)
			}
		}
		err := s.ns.EnableJetStream(&server.JetStreamConfig{
			StoreDir: s.dir, MaxStore: s.cfg.MaxStore, SyncAlways: s.cfg.SyncAlways, Strict: true,
			MaxMemory: s.maxMemory,
		})
		if err != nil && !s.ns.JetStreamEnabled() {
			s.writeFailed.Store(true)
			if failures%30 == 0 {
				s.logger().Error("nats embedded: JetStream cannot be started again; publishes fail until it is", "dir", s.dir, "error", err)
			}
			failures++
			continue
		}
		failures = 0
		s.logger().Warn("nats embedded: JetStream restarted after a disk write failure; streams and consumers reloaded", "dir", s.dir)
	}
}

// free returns the free space of the store's file system.
func (s *Server) free() int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

func (s *Server) logger() *slog.Logger {
	if s.cfg.Logger != nil {
		return s.cfg.Logger
	}
	return slog.Default()
}

// ClientURL returns the URL other processes connect to, or "" when the
// server has no network listener.
func (s *Server) ClientURL() string {
	if s.cfg.Listen == "" {
		return ""
	}
	return s.ns.ClientURL()
}

// Dir returns the server's store directory.
func (s *Server) Dir() string { return s.ns.StoreDir() }

// Connect opens a client connection: in-process when the server has no
// listener, else over TCP to ClientURL (so that it reconnects to a server
// restarted on the same address).
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	url := s.ClientURL()
	base := []nats.Option{nats.Name("idem"), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if url == "" {
		base = append(base, nats.InProcessServer(s.ns))
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("idem: nats embedded: connect: %w", err)
	}
	return nc, nil
}

// NATSServer returns the underlying server, for monitoring or tests.
func (s *Server) NATSServer() *server.Server { return s.ns }

// Shutdown stops the server: client connections are closed and JetStream
// writes what it holds to disk. It waits until the server has stopped, or
// ctx ends (the server keeps stopping in the background).
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop.Do(func() { close(s.quit) })
	done := make(chan struct{})
	go func() {
		<-s.done
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		_ = s.lock.Release()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slogLogger adapts a *slog.Logger (nil: log nothing) to the server's
// logger, and calls writeFailed when the server reports that a write to
// disk failed for lack of space: the server exposes that condition in its
// log only (it recognises it by the same text, "no space left").
type slogLogger struct {
	l           *slog.Logger
	writeFailed func()
}

func (l slogLogger) log(level slog.Level, format string, v ...any) {
	if l.l != nil {
		l.l.Log(context.Background(), level, fmt.Sprintf(format, v...))
	}
}

func (l slogLogger) Noticef(format string, v ...any) { l.log(slog.LevelDebug, format, v...) }
func (l slogLogger) Warnf(format string, v ...any)   { l.log(slog.LevelWarn, format, v...) }
func (l slogLogger) Fatalf(format string, v ...any)  { l.errorf(format, v...) }
func (l slogLogger) Errorf(format string, v ...any)  { l.errorf(format, v...) }
func (l slogLogger) Debugf(format string, v ...any)  { l.log(slog.LevelDebug, format, v...) }
func (l slogLogger) Tracef(format string, v ...any)  {}

func (l slogLogger) errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "no space left") {
		l.writeFailed()
	}
	if l.l != nil {
		l.l.Error(msg)
	}
}
