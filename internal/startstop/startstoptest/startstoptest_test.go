package startstoptest

import (
	"context"
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/startstop"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dialer is a service whose Start connects to a server and waits for its
// greeting, which a SilentListener never sends.
type dialer struct {
	addr string
	base startstop.Base
}

func (d *dialer) Start(ctx context.Context) error {
	if err := d.base.Starting(); err != nil {
		return err
	}
	ctx, cancel := d.base.StartContext(ctx)
	defer cancel()
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", d.addr)
	if err != nil {
		d.base.StartFailed()
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	if _, err := c.Read(make([]byte, 1)); err != nil {
		d.base.StartFailed()
		return err
	}
	go func() { <-d.base.Stopping(); d.base.Finished() }()
	d.base.Running()
	return nil
}

func (d *dialer) Stop(ctx context.Context) error { return d.base.Stop(ctx, nil, nil) }
func (d *dialer) Done() <-chan struct{}          { return d.base.Done() }

func TestStopDuringStart(t *testing.T) {
	StopDuringStart(t, func(t *testing.T) (Service, <-chan struct{}) {
		addr, accepted := SilentListener(t)
		return &dialer{addr: addr}, accepted
	})
}
