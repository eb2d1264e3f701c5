// Package billing is the shop's billing service. Its consumer "billing"
// creates one invoice per placed order and publishes
// billing.invoice.created.v1 through its outbox in the same transaction.
//
// Sending the invoice by e-mail is an effect outside the database, which a
// rollback cannot undo. As the first article advises, it is not done in that
// transaction: a second consumer, "billing-mailer", reacts to
// billing.invoice.created.v1 after the invoice committed and calls the mail
// service with its own idempotency key, invoice:<order id>:email, so a
// retried or redelivered message sends one e-mail.
//
// When an order is cancelled (order.order.cancelled.v1), "billing" voids its
// invoice and publishes billing.invoice.voided.v1; "billing-mailer" then
// tells the customer, with the key invoice:<order id>:void-email, if the
// invoice was e-mailed (marked so, or known to the mail service by its
// key: an attempt that sent it may have crashed before its mark), and
// never e-mails an invoice voided already. A
// versioned copy of each order's status makes an order placed event handled
// after the cancellation (a parked message retried late) invoice nothing.
package billing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/store"
)

// Consumer names.
const (
	InvoiceConsumer = "billing"
	MailerConsumer  = "billing-mailer"
)

var migrations = store.Migrations{
	store.Postgres: {`
CREATE TABLE invoice (
    id          varchar(36)  PRIMARY KEY,
    order_id    varchar(64)  NOT NULL,
    customer_id varchar(100) NOT NULL,
    lines       integer      NOT NULL,
    created_at  timestamptz  NOT NULL,
    emailed_at  timestamptz,
    email_id    varchar(36),
    CONSTRAINT invoice_order_key UNIQUE (order_id)
);
`, `
ALTER TABLE invoice ADD COLUMN voided_at timestamptz;
ALTER TABLE invoice ADD COLUMN void_email_id varchar(36);
CREATE TABLE order_status (
    order_id varchar(64) PRIMARY KEY,
    version  bigint      NOT NULL,
    status   varchar(20) NOT NULL
);
`},
	// "lines" is a reserved word in MySQL.
	store.MySQL: {`
CREATE TABLE invoice (
    id          VARCHAR(36)  NOT NULL PRIMARY KEY,
    order_id    VARCHAR(64)  NOT NULL,
    customer_id VARCHAR(100) NOT NULL,
    ` + "`lines`" + `     INT          NOT NULL,
    created_at  DATETIME(6)  NOT NULL,
    emailed_at  DATETIME(6),
    email_id    VARCHAR(36),
    CONSTRAINT invoice_order_key UNIQUE (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`, `
ALTER TABLE invoice ADD COLUMN voided_at DATETIME(6) NULL;
ALTER TABLE invoice ADD COLUMN void_email_id VARCHAR(36) NULL;
CREATE TABLE order_status (
    order_id VARCHAR(64) NOT NULL PRIMARY KEY,
    version  BIGINT      NOT NULL,
    status   VARCHAR(20) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`},
	store.SQLite: {`
CREATE TABLE invoice (
    id          TEXT      NOT NULL PRIMARY KEY,
    order_id    TEXT      NOT NULL,
    customer_id TEXT      NOT NULL,
    lines       INTEGER   NOT NULL,
    created_at  timestamp NOT NULL,
    emailed_at  timestamp,
    email_id    TEXT,
    CONSTRAINT invoice_order_key UNIQUE (order_id)
);
`, `
ALTER TABLE invoice ADD COLUMN voided_at timestamp;
ALTER TABLE invoice ADD COLUMN void_email_id TEXT;
CREATE TABLE order_status (
    order_id TEXT    NOT NULL PRIMARY KEY,
    version  INTEGER NOT NULL,
    status   TEXT    NOT NULL
);
`},
}

// qInsertInvoice is per dialect (store.DB.Pick): on MySQL, "lines" is quoted
// and a duplicate is skipped by ON DUPLICATE KEY UPDATE, which affects no
// row either. The other queries are written once, with $n placeholders
// (store.DB.Q adapts them).
var qInsertInvoice = map[string]string{
	store.Postgres: `INSERT INTO invoice (id, order_id, customer_id, lines, created_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (order_id) DO NOTHING`,
	store.MySQL: "INSERT INTO invoice (id, order_id, customer_id, `lines`, created_at) VALUES (?, ?, ?, ?, ?)\n" +
		"ON DUPLICATE KEY UPDATE order_id = order_id",
}

const (
	qEmailed     = `UPDATE invoice SET emailed_at = $1, email_id = $2 WHERE order_id = $3`
	qVoid        = `UPDATE invoice SET voided_at = $1 WHERE order_id = $2 AND voided_at IS NULL`
	qInvoice     = `SELECT id, customer_id, emailed_at, voided_at FROM invoice WHERE order_id = $1`
	qVoidEmailed = `UPDATE invoice SET void_email_id = $1 WHERE order_id = $2`
	qStatus      = `SELECT status FROM order_status WHERE order_id = $1`
)

// statusCopy is the versioned copy of each order's status.
var statusCopy = inbox.StateCopy{Table: "order_status", Key: "order_id", Version: "version", Columns: []string{"status"}}

// Migrations returns the billing service's own migrations.
func Migrations() store.Migrations { return migrations }

// EmailKey returns the mail idempotency key of an order's invoice e-mail.
func EmailKey(orderID string) string { return "invoice:" + orderID + ":email" }

// VoidEmailKey returns the mail idempotency key of the e-mail telling that
// an order's invoice is void.
func VoidEmailKey(orderID string) string { return "invoice:" + orderID + ":void-email" }

// Service is the billing service.
type Service struct {
	db      *store.DB
	outbox  *outbox.Writer[*sql.Tx]
	mail    *carrier.Client
	invoice *inbox.Consumer[*sql.Tx]
	mailer  *inbox.Consumer[*sql.Tx]
	log     *slog.Logger
}

// New returns the billing service on db, whose migrations must be applied,
// sending e-mails through mail.
func New(db *store.DB, mail *carrier.Client, log *slog.Logger) (*Service, error) {
	inv, err := db.NewConsumer(inbox.Config{Name: InvoiceConsumer, Logger: log})
	if err != nil {
		return nil, err
	}
	mailer, err := db.NewConsumer(inbox.Config{Name: MailerConsumer, Logger: log})
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	s := &Service{db: db, outbox: db.OutboxWriter(), mail: mail, invoice: inv, mailer: mailer, log: log.With("service", "billing")}
	inbox.HandleJSON(inv, shop.OrderPlaced, shop.ForOrder(s.onOrderPlaced))
	inbox.HandleJSON(inv, shop.OrderCancelled, shop.ForOrder(s.onOrderCancelled))
	inbox.HandleJSON(mailer, shop.InvoiceCreated, shop.ForOrder(s.onInvoiceCreated))
	inbox.HandleJSON(mailer, shop.InvoiceVoided, shop.ForOrder(s.onInvoiceVoided))
	return s, nil
}

// Consumers returns the invoice and mailer consumers.
func (s *Service) Consumers() []*inbox.Consumer[*sql.Tx] {
	return []*inbox.Consumer[*sql.Tx]{s.invoice, s.mailer}
}

func (s *Service) onOrderPlaced(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderPlacedV1) error {
	copied, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, p.OrderID, ev.AggregateVersion, "placed")
	if err != nil {
		return err
	}
	status := "placed" // applied: the copy holds this event's status
	if copied.Stale() {
		// A later event came first: read what it left.
		if err := tx.QueryRowContext(ctx, s.db.Q(qStatus), p.OrderID).Scan(&status); err != nil {
			return err
		}
	}
	if status == "cancelled" {
		return nil // the cancellation came first: invoice nothing
	}
	invoiceID := idem.NewEventID().String()
	res, err := tx.ExecContext(ctx, s.db.Pick(qInsertInvoice), invoiceID, p.OrderID, p.CustomerID, len(p.Lines), time.Now().UTC())
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil // the order is invoiced already
	}
	out, err := idem.NewEvent(shop.InvoiceCreated, shop.AggregateInvoice, p.OrderID,
		shop.InvoiceCreatedV1{OrderID: p.OrderID, InvoiceID: invoiceID, CustomerID: p.CustomerID, Lines: len(p.Lines)})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.InvoiceCreatedVersion
	return s.outbox.Add(ctx, tx, out)
}

// invoiceState is an order's invoice, as the mailer reads it.
type invoiceState struct {
	id, customerID  string
	emailed, voided bool
}

func (s *Service) invoiceOf(ctx context.Context, tx *sql.Tx, orderID string) (invoiceState, error) {
	var (
		inv               invoiceState
		emailedAt, voidAt sql.NullTime
	)
	err := tx.QueryRowContext(ctx, s.db.Q(qInvoice), orderID).Scan(&inv.id, &inv.customerID, &emailedAt, &voidAt)
	inv.emailed, inv.voided = emailedAt.Valid, voidAt.Valid
	return inv, err
}

func (s *Service) onInvoiceCreated(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.InvoiceCreatedV1) error {
	inv, err := s.invoiceOf(ctx, tx, p.OrderID)
	if errors.Is(err, sql.ErrNoRows) {
		return s.db.NotVisible(ctx, s.log, MailerConsumer, ev, "invoice", p.OrderID)
	}
	if err != nil {
		return err
	}
	if inv.voided {
		return nil // the order was cancelled first: never e-mail a void invoice
	}
	e, err := s.mail.SendEmail(ctx, EmailKey(p.OrderID), p.CustomerID+"@customers.example", "Your invoice "+p.InvoiceID)
	if err != nil {
		return fmt.Errorf("send invoice e-mail for order %s: %w", p.OrderID, err)
	}
	return updateOne(ctx, tx, s.db.Q(qEmailed), "mark the invoice of order "+p.OrderID+" e-mailed", time.Now().UTC(), e.ID, p.OrderID)
}

// updateOne runs an UPDATE that must change exactly one row: the row the
// event announces. Otherwise the delivery fails, and nothing it did is
// committed: an e-mail sent is sent again with the same idempotency key,
// which the mail service answers with the first e-mail.
func updateOne(ctx context.Context, tx *sql.Tx, query, what string, args ...any) error {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != 1 {
		return idem.Transient(fmt.Errorf("%s: the update matched %d rows, want 1", what, n))
	}
	return nil
}

// onOrderCancelled voids the order's invoice and publishes
// billing.invoice.voided.v1.
func (s *Service) onOrderCancelled(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.OrderCancelledV1) error {
	if _, err := inbox.ApplyState(ctx, s.db.Driver, tx, statusCopy, p.OrderID, ev.AggregateVersion, "cancelled"); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, s.db.Q(qVoid), time.Now().UTC(), p.OrderID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil // no invoice (the order was never invoiced), or voided already
	}
	inv, err := s.invoiceOf(ctx, tx, p.OrderID)
	if err != nil {
		return err
	}
	out, err := idem.NewEvent(shop.InvoiceVoided, shop.AggregateInvoice, p.OrderID,
		shop.InvoiceVoidedV1{OrderID: p.OrderID, InvoiceID: inv.id, CustomerID: inv.customerID})
	if err != nil {
		return err
	}
	out.AggregateVersion = shop.InvoiceVoidedVersion
	return s.outbox.Add(ctx, tx, out)
}

// onInvoiceVoided tells the customer that the invoice is void, if it was
// e-mailed: the mailer handles an invoice's events in order, so an invoice
// not e-mailed by now never will be. An invoice not marked e-mailed may
// have been e-mailed all the same: a first attempt sent the e-mail, and its
// transaction, with the mark, did not commit (a crash); the retry found the
// invoice voided and sent nothing. So the mail service is asked, by the
// e-mail's key, and the mark written when it sent one.
func (s *Service) onInvoiceVoided(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.InvoiceVoidedV1) error {
	inv, err := s.invoiceOf(ctx, tx, p.OrderID)
	if errors.Is(err, sql.ErrNoRows) {
		return s.db.NotVisible(ctx, s.log, MailerConsumer, ev, "voided invoice", p.OrderID)
	}
	if err != nil {
		return err
	}
	if !inv.emailed {
		sent, err := s.mail.FindEmail(ctx, EmailKey(p.OrderID))
		if errors.Is(err, carrier.ErrNoEmail) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up the invoice e-mail of cancelled order %s: %w", p.OrderID, err)
		}
		s.log.Warn("invoice e-mail found at the mail service for a voided invoice not marked e-mailed; telling the customer it is void", "order_id", p.OrderID, "email_id", sent.ID)
		if err := updateOne(ctx, tx, s.db.Q(qEmailed), "mark the invoice of order "+p.OrderID+" e-mailed", time.Now().UTC(), sent.ID, p.OrderID); err != nil {
			return err
		}
	}
	e, err := s.mail.SendEmail(ctx, VoidEmailKey(p.OrderID), p.CustomerID+"@customers.example", "Invoice "+p.InvoiceID+" is void: your order was cancelled")
	if err != nil {
		return fmt.Errorf("send void invoice e-mail for order %s: %w", p.OrderID, err)
	}
	return updateOne(ctx, tx, s.db.Q(qVoidEmailed), "record the void e-mail of order "+p.OrderID, e.ID, p.OrderID)
}
