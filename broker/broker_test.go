package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// TestIsFault: errors that say the broker did not answer are faults; those
// that say it refused are not.
func TestIsFault(t *testing.T) {
	refused := errors.New("message too large")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"deadline", context.DeadlineExceeded, true},
		{"cancelled", context.Canceled, true},
		{"deadline wrapped", fmt.Errorf("publish: %w", context.DeadlineExceeded), true},
		{"transient", idem.Transient(errors.New("channel closed")), true},
		{"transient wrapped", fmt.Errorf("confirm: %w", idem.Transient(errors.New("channel closed"))), true},
		{"net.Error", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route to host")}, true},
		{"closed connection", fmt.Errorf("write: %w", net.ErrClosed), true},
		{"EOF", io.EOF, true},
		{"unexpected EOF", fmt.Errorf("read frame: %w", io.ErrUnexpectedEOF), true},
		{"connection refused", os.NewSyscallError("connect", syscall.ECONNREFUSED), true},
		{"connection reset", os.NewSyscallError("read", syscall.ECONNRESET), true},
		{"broken pipe", os.NewSyscallError("write", syscall.EPIPE), true},
		{"unroutable", fmt.Errorf("exchange events: %w", broker.ErrUnroutable), false},
		{"a refusal", refused, false},
		{"a refusal marked", broker.Refused(refused), false},
		{"permanent", idem.Permanent(errors.New("bad")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := broker.IsFault(tt.err); got != tt.want {
				t.Errorf("IsFault(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// TestRefused: Refused marks an error as a refusal that IsRefused finds
// through wrapping; the error reads and matches as the one it marks.
func TestRefused(t *testing.T) {
	cause := errors.New("webhook answered 413 Request Entity Too Large")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"unmarked", cause, false},
		{"marked", broker.Refused(cause), true},
		{"marked then wrapped", fmt.Errorf("publish: %w", broker.Refused(cause)), true},
		{"joined", errors.Join(errors.New("other"), broker.Refused(cause)), true},
		{"unroutable, unmarked", broker.ErrUnroutable, false},
		{"fault", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := broker.IsRefused(tt.err); got != tt.want {
				t.Errorf("IsRefused(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
	if err := broker.Refused(nil); err != nil {
		t.Errorf("Refused(nil) = %v, want nil", err)
	}
	r := broker.Refused(cause)
	if !errors.Is(r, cause) || r.Error() != cause.Error() {
		t.Errorf("Refused(cause) = %q, matches cause: %v; want it to read and match as cause", r, errors.Is(r, cause))
	}
}

// TestResults: a Publish error becomes one error per message.
func TestResults(t *testing.T) {
	down := errors.New("broker down")
	one := errors.New("refused")
	tests := []struct {
		name string
		err  error
		n    int
		want []error
	}{
		{"nil", nil, 2, []error{nil, nil}},
		{"whole call", down, 2, []error{down, down}},
		{"batch", &broker.BatchError{Errs: []error{nil, one}}, 2, []error{nil, one}},
		{"batch wrapped", fmt.Errorf("publish: %w", &broker.BatchError{Errs: []error{one, nil}}), 2, []error{one, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := broker.Results(tt.err, tt.n)
			if len(got) != len(tt.want) {
				t.Fatalf("Results = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("Results[%d] = %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
	// A BatchError of the wrong length stands for every message.
	be := &broker.BatchError{Errs: []error{one}}
	for i, err := range broker.Results(be, 3) {
		if err != be {
			t.Errorf("Results(short BatchError)[%d] = %v, want the BatchError", i, err)
		}
	}
}

func TestBatchError(t *testing.T) {
	one, two := errors.New("refused one"), errors.New("refused two")
	be := &broker.BatchError{Errs: []error{nil, one, nil, two}}
	if want := "idem: 2 of 4 message(s) not accepted by the broker; first: refused one"; be.Error() != want {
		t.Errorf("Error() = %q, want %q", be.Error(), want)
	}
	if !errors.Is(be, one) || !errors.Is(be, two) {
		t.Error("a BatchError does not match its per-message errors")
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"amqp://guest:secret@localhost:5672/", "amqp://guest:xxxxx@localhost:5672/"},
		{"nats://user:p@ss@host:4222", "nats://user:xxxxx@host:4222"},
		{"amqp://guest@localhost/", "amqp://guest@localhost/"},
		{"kafka://localhost:9092", "kafka://localhost:9092"},
		{"not a url", "not a url"},
	}
	for _, tt := range tests {
		if got := broker.RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
