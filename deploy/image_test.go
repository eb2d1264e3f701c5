package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/adminhttp/adminhttptest"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/outbox"
)

// TestRelayImage builds the idem image (make image's scripts/image.sh) and
// runs it as docs/DEPLOYMENT.md does, against the test servers (on this
// machine's loopback: the containers share its network): idem migrate up
// as the migration Job, then the image's default command, the polling relay,
// with the database and broker URLs (with passwords) and the token in files
// mounted where that command reads them, its address beyond the container's
// loopback (only the port changed, free on this machine), on a read-only
// root file system. The relay publishes every event written to the outbox
// and marks its row, and an idempotent consumer applies each once, in order
// per aggregate; /healthz answers without the token, /metrics with it only;
// podman stop (SIGTERM) ends it cleanly, exit status 0; no password or
// token is in any output.
func TestRelayImage(t *testing.T) {
	t.Parallel()
	pm := newPodman(t)
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	dbURL, dbPassword := testdb.WithPassword(t, pg.URL)
	brokerURL, brokerPassword := testamqp.UserURL(t)
	amqpURL := testamqp.URL(t)
	exchange := testamqp.Name("idem_image_")
	token := "tok" + shopkit.RandomSuffix()
	secrets := []string{dbPassword, brokerPassword, token}
	im := pm.build(t, "idem")

	if got, want := pm.output(t, "run", "--rm", im.ref, "version"), "idem "+im.version+" "; !strings.HasPrefix(got, want) {
		t.Errorf("idem version in the image: %q, want %q...", got, want)
	}

	// The default command reads its secrets from files in one directory,
	// mounted from a Secret.
	cmd := im.config.Cmd
	if len(cmd) == 0 || cmd[0] != "relay" {
		t.Fatalf("the image's default command is %q, want idem relay", cmd)
	}
	dbFile, brokerFile, tokenFile := flagValue(t, cmd, "--db-file"), flagValue(t, cmd, "--broker-file"), flagValue(t, cmd, "--auth-token-file")
	mountAt := filepath.Dir(dbFile)
	if filepath.Dir(brokerFile) != mountAt || filepath.Dir(tokenFile) != mountAt {
		t.Fatalf("the default command reads its secrets from several directories: %q", cmd)
	}
	if addr := flagValue(t, cmd, "--metrics-addr"); addr != ":9464" {
		t.Errorf("the default command serves on %q, want :9464 (beyond the container's loopback)", addr)
	}
	secretsDir := secretDir(t, map[string]string{
		filepath.Base(dbFile):     dbURL,
		filepath.Base(brokerFile): brokerURL + "?exchange=" + exchange,
		filepath.Base(tokenFile):  token,
	})
	// A read-only root file system, as the manifests of deploy/kubernetes
	// give it.
	runArgs := []string{"--network", "host", "--read-only", "--read-only-tmpfs=false", "-v", secretsDir + ":" + mountAt + ":ro", im.ref}

	var outputs []string
	migrate := pm.command(append([]string{"run", "--rm"}, append(runArgs, "migrate", "up", "--db-file", dbFile)...)...)
	out, err := migrate.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Applied") {
		t.Fatalf("idem migrate up in the image: %v\n%s", err, out)
	}
	outputs = append(outputs, string(out))

	// The library's own subscriber feeding an idempotent consumer, on the
	// queue it declares (it binds it to every event of the exchange),
	// deleted once the subscriber has stopped (cleanups run last first), so
	// that it does not declare it again.
	t.Cleanup(func() { deleteExchange(t, amqpURL, exchange, exchange+".stock") })
	consumer := brokertest.EffectConsumer(t, pg.Driver, inbox.Config{Name: "stock"}, nil)
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: amqpURL, Logger: brokertest.LogTo(t)},
		Exchange:   exchange, Queue: exchange + ".stock", Bindings: []string{"#"},
	}, consumer.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	local, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(local, ":")
	args := slices.Clone(cmd)
	args[slices.Index(args, "--metrics-addr")+1] = "0.0.0.0:" + port
	relay := pm.start(t, append(runArgs, args...)...)
	relay.waitOutput(t, "msg=relaying", 2*time.Minute)

	const n = 20
	ctx := context.Background()
	var evs []idem.Event
	var msgs []idem.Message
	for i := range n {
		ev, err := idem.NewEvent("order.placed.v1", "order", fmt.Sprint(i%4), map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ev.AggregateVersion = int64(i/4 + 1)
		msg, err := idem.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		evs, msgs = append(evs, ev), append(msgs, msg)
	}
	if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return outbox.NewWriter(pg.Driver).Add(ctx, tx, evs...) }); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, time.Minute, "every row marked published and its event applied", func() bool {
		return pg.Count(t, "outbox WHERE published_at IS NOT NULL") == n && pg.Count(t, "processed_event WHERE consumer_name = 'stock'") == n
	})
	brokertest.CheckOnceInOrder(t, pg, "stock", msgs)

	base := "http://127.0.0.1:" + port
	bodies := adminhttptest.Check(t, base, token, []adminhttptest.Path{
		{Path: "/healthz", Status: http.StatusOK, Open: []string{"ok\n"}},
		{Path: "/metrics", Status: http.StatusOK},
		{Path: "/", Status: http.StatusNotFound},
	}, secrets...)
	if v, ok := sample(bodies["/metrics"], "idem_relay_published_total"); !ok || v < n {
		t.Errorf("/metrics: idem_relay_published_total %v (found: %v), want at least %d", v, ok, n)
	}

	if code := pm.stop(t, relay); code != 0 {
		t.Errorf("the relay's container exited with status %d after SIGTERM, want 0:\n%s", code, tail(relay.out.String()))
	}
	outputs = append(outputs, relay.out.String())
	for _, want := range []string{"relay stopped", ":xxxxx@127.0.0.1"} {
		if !strings.Contains(outputs[1], want) {
			t.Errorf("the relay's output does not say %q:\n%s", want, tail(outputs[1]))
		}
	}
	for i, out := range outputs {
		adminhttptest.NoSecret(t, []string{"idem migrate up's output", "the relay's output"}[i], out, secrets...)
	}
}

// TestShopImage builds the shop's image and runs its default command, as
// it is, on a network of its own with the admin port published: without
// the token file it refuses to start; with it, the services run on the
// embedded defaults in /data (SQLite, NATS JetStream), the image's volume,
// as a user that is not root on an otherwise read-only file system, the
// admin address answers beyond the container's loopback
// (/healthz without the token, /metrics and /dashboard/ with it), and
// podman stop ends it cleanly, exit status 0.
func TestShopImage(t *testing.T) {
	t.Parallel()
	pm := newPodman(t)
	im := pm.build(t, "shop")
	if got, want := pm.output(t, "run", "--rm", im.ref, "version"), "shop "+im.version+" "; !strings.HasPrefix(got, want) {
		t.Errorf("shop version in the image: %q, want %q...", got, want)
	}
	// The embedded defaults write in /data: a volume under podman, which
	// gives it to the container's user, but a directory of the image's user
	// for a runtime that copies the image's ownership into a new volume
	// (docker), or that runs it without one.
	dataDir := strings.TrimPrefix(im.env(t, "SHOP_DATA_DIR"), "/")
	if h := im.files[dataDir]; h == nil || !h.FileInfo().IsDir() || h.Uid != 65532 {
		t.Errorf("the shop's image: /%s is %v, want a directory owned by 65532", dataDir, h)
	}
	tokenFile, adminAddr := im.env(t, "SHOP_ADMIN_TOKEN_FILE"), im.env(t, "SHOP_ADMIN_ADDR")
	_, adminPort, _ := strings.Cut(adminAddr, ":")

	refused := pm.start(t, im.ref)
	if code := refused.wait(t, time.Minute); code == 0 || !strings.Contains(refused.out.String(), tokenFile) {
		t.Errorf("the shop's image without %s: exit status %d, want a refusal naming the file:\n%s", tokenFile, code, tail(refused.out.String()))
	}

	token := "tok" + shopkit.RandomSuffix()
	dir := secretDir(t, map[string]string{filepath.Base(tokenFile): token})
	local, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// A read-only root file system but the image's volume, /data.
	shop := pm.start(t, "--read-only", "--read-only-tmpfs=false", "-p", local+":"+adminPort, "-v", dir+":"+filepath.Dir(tokenFile)+":ro", im.ref)
	shop.waitOutput(t, "shop: ready", 2*time.Minute)
	bodies := adminhttptest.Check(t, "http://"+local, token, []adminhttptest.Path{
		{Path: "/healthz", Status: http.StatusOK, Open: []string{"ok\n"}},
		{Path: "/metrics", Status: http.StatusOK},
		{Path: "/dashboard/", Status: http.StatusOK},
	}, token)
	if !strings.Contains(bodies["/metrics"], "idem_relay_published_total") {
		t.Errorf("/metrics has no relay metric:\n%.2000s", bodies["/metrics"])
	}
	if code := pm.stop(t, shop); code != 0 || !strings.Contains(shop.out.String(), "shop: stopped") {
		t.Errorf("the shop's container after SIGTERM: exit status %d, want 0 and \"shop: stopped\":\n%s", code, tail(shop.out.String()))
	}
	adminhttptest.NoSecret(t, "the shop's output", shop.out.String(), token)
}

// deleteExchange deletes the test's exchange and queues from the node at
// url.
func deleteExchange(t *testing.T, url, exchange string, queues ...string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Error(err)
		return
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	_ = ch.ExchangeDelete(exchange, false, false)
}

// sample returns the value of metric's sample without labels in a scrape.
func sample(scrape, metric string) (float64, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(line, metric+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
