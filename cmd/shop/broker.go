package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/registry"
)

var brokerEnv = map[string]string{"data-dir": "SHOP_DATA_DIR", "listen": "SHOP_BROKER_LISTEN"}

// brokerMain runs the embedded NATS JetStream server alone ("shop broker"),
// so that shop processes on one machine share a broker that none of them
// owns: each is started with --broker nats://LISTEN.
func brokerMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shop broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", registry.EmbeddedDirDefault, "directory of the embedded data; the broker keeps its streams in its nats subdirectory")
	listen := fs.String("listen", "127.0.0.1:4222", "host:port the broker listens on for clients")
	fs.Usage = envflag.Usage(fs, brokerEnv, `Usage: shop broker [flags]

Runs the shop's embedded NATS JetStream server alone, with its data under
--data-dir, until Ctrl-C or SIGTERM. Shop processes on this machine then
share it as their broker (shop --broker nats://127.0.0.1:4222 ...), and it
can be stopped, killed and restarted on its own: shopctl chaos --random does so
on the embedded defaults. It prints "shop: ready" once it accepts
connections.

Flags (each also read from the environment variable in brackets):
`, `
Example:
  shop broker --data-dir /tmp/shop --listen 127.0.0.1:4222 &
  shop --broker nats://127.0.0.1:4222 --db sqlite:/tmp/shop/db
`)
	if err := envflag.Parse(fs, args, brokerEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("shop broker takes no arguments (got %q): see shop broker --help", fs.Args()))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := embedded.Start(ctx, embedded.Config{
		Dir:        filepath.Join(*dataDir, "nats"),
		Listen:     *listen,
		SyncAlways: true,
		Logger:     slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("start the broker on %s (--listen) with its data in %s (--data-dir): %w", *listen, *dataDir, err)
	}
	fmt.Fprintf(stdout, "shop: broker listening on %s\n", srv.ClientURL())
	fmt.Fprintln(stdout, "shop: ready")
	<-ctx.Done()
	return srv.Shutdown(context.Background())
}
