package idem

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// OccurredAtLayout is the layout of occurred_at in the envelope: UTC, always
// six fractional digits, so equal events encode to equal bytes.
const OccurredAtLayout = "2006-01-02T15:04:05.000000Z"

// DefaultMaxBodyBytes is the default limit on a received message body (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// MarshalEnvelope encodes ev as the JSON envelope of the wire contract:
//
//	{"event_id":"…","event_name":"…","occurred_at":"…","aggregate_type":"…",
//	 "aggregate_id":"…","aggregate_version":3,"payload":{…}}
//
// The encoding is deterministic: fields in this order, occurred_at in UTC with
// microseconds, payload compacted. An empty payload is encoded as null. Headers
// are not part of the envelope; transports carry them.
//
// An event with a content type has it in "content_type", before the payload.
// A JSON payload (IsJSONContentType) is "payload", as above; any other
// payload is "payload_base64", its bytes in standard base64 with padding, so
// that the envelope stays JSON:
//
//	{…,"aggregate_version":3,"content_type":"application/x-protobuf","payload_base64":"CgVoZWxsbw=="}
func MarshalEnvelope(ev Event) ([]byte, error) {
	return AppendEnvelope(make([]byte, 0, 256+len(ev.Payload)), ev)
}

// AppendEnvelope appends the envelope of ev to dst, as MarshalEnvelope.
func AppendEnvelope(dst []byte, ev Event) ([]byte, error) {
	if err := ev.Validate(); err != nil {
		return dst, fmt.Errorf("idem: encode envelope: %w", err)
	}
	dst = append(dst, `{"event_id":"`...)
	dst = append(dst, ev.ID.String()...)
	dst = append(dst, `","event_name":`...)
	dst = appendJSONString(dst, ev.Name)
	dst = append(dst, `,"occurred_at":"`...)
	dst = ev.OccurredAt.UTC().AppendFormat(dst, OccurredAtLayout)
	dst = append(dst, `","aggregate_type":`...)
	dst = appendJSONString(dst, ev.AggregateType)
	dst = append(dst, `,"aggregate_id":`...)
	dst = appendJSONString(dst, ev.AggregateID)
	dst = append(dst, `,"aggregate_version":`...)
	dst = strconv.AppendInt(dst, ev.AggregateVersion, 10)
	if ev.ContentType != "" {
		dst = append(dst, `,"content_type":`...)
		dst = appendJSONString(dst, ev.ContentType)
	}
	if !ev.IsJSON() {
		dst = append(dst, `,"payload_base64":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, ev.Payload)
		return append(dst, `"}`...), nil
	}
	dst = append(dst, `,"payload":`...)
	if len(bytes.TrimSpace(ev.Payload)) == 0 {
		dst = append(dst, "null"...)
	} else {
		buf := bytes.NewBuffer(dst)
		if err := json.Compact(buf, ev.Payload); err != nil {
			return dst, fmt.Errorf("idem: encode envelope: %w", &FieldError{Field: "payload", Problem: "is not valid JSON"})
		}
		dst = buf.Bytes()
	}
	dst = append(dst, '}')
	return dst, nil
}

// appendJSONString appends s as a JSON string. It escapes like encoding/json
// without HTML escaping, and replaces invalid UTF-8 with U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Decoder turns received messages into events. It accepts the idem JSON
// envelope (with "payload", or "content_type" and "payload_base64" for a
// payload that is not JSON: see MarshalEnvelope), what Debezium's Outbox Event Router emits (key = aggregate id,
// header "id" = event id, optional header "eventType", value = the bare payload
// or a JSON string holding it), and CloudEvents 1.0 in binary and structured
// content mode on every transport (see CloudEvents, and "Receiving
// CloudEvents" below). The zero Decoder is ready to use.
//
// # Receiving Debezium records
//
// Debezium copies the outbox row's id, whatever it is, into the "id"
// header: it becomes the event id by the rule of EventID, the one the
// relays apply to the same row, so that a row is one event whichever path
// published it. A UUID is itself (with or without braces or a "urn:uuid:"
// prefix, in either case); any other id of 1 to 64 bytes of UTF-8 text
// without control characters, as written (no trimming), gives its derived
// UUID, and the event's headers then hold the id in HeaderOriginalID, as
// the relays send it (replacing a header of that name in the record). An
// id that EventID refuses (empty, over 64 bytes, not UTF-8, with a control
// character, the nil UUID) makes the record undecodable, the error saying
// why; the event returned with the error holds the record's aggregate, so
// that, parked, it holds back its aggregate's later events as any parked
// event does. The envelope's "event_id", which only idem writes, stays the
// 36-character form of a UUID.
//
// # Receiving CloudEvents
//
// A message is a structured CloudEvent when its content type (the header
// "content-type" in any case; RabbitMQ's content-type property) starts with
// application/cloudevents, or when it has no such header, no "id" header and
// a JSON object body with "specversion" but no "event_id". It is a binary
// CloudEvent when it has the header of a binding for specversion, id, source
// or type: "ce_specversion" (Kafka), "ce-specversion" (NATS, values
// percent-decoded), "cloudEvents_specversion" or "cloudEvents:specversion"
// (AMQP), header names in any case. Only the
// JSON event format is read.
//
// The attributes specversion ("1.0"), id, source and type are required; a
// CloudEvent without one is undecodable, and the error names it. The id
// becomes the event id by the rule of EventID: a UUID is itself, any other
// id of 1 to 64 bytes gives a derived UUID and is kept in the header
// HeaderOriginalID. type is the event name, time (RFC 3339) the occurrence,
// subject the aggregate id (else the message key), the extensions
// aggregatetype and aggregateversion the aggregate type (else the
// transport's) and version. With datacontenttype absent, application/json,
// text/json or any +json type, the data must be JSON, and no data is the
// payload null. With any other datacontenttype (application/x-protobuf,
// application/avro...), the event's ContentType is that type and its
// Payload the data's bytes: the body as received in binary mode; in
// structured mode, data_base64's bytes, or the text of a data that is a
// JSON string.
//
// The event's headers are the message's other headers, every attribute as
// "ce_<name>" (CloudEventsHeaderPrefix) in its string form, and the
// traceparent and tracestate attributes as the headers "traceparent" and
// "tracestate" when the message has no header of that name.
type Decoder struct {
	// MaxBodyBytes limits the size of a body. Defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int
}

// Decode decodes msg with a zero Decoder.
func Decode(msg Message) (Event, error) { return Decoder{}.Decode(msg) }

// Decode turns msg into an Event. Every error matches ErrUndecodable and names
// the field and the problem, for example "event_id is not a UUID". With an
// error, the Event holds what could be read before it (its id and aggregate,
// when known), for the failure store.
//
// A Debezium record's event id is its "id" header by the rule of EventID
// (see "Receiving Debezium records" above); its event name is its
// "eventType" header, else msg.EventName (a transport's default for the
// topic); a record with neither is undecodable, never ignored.
func (d Decoder) Decode(msg Message) (Event, error) {
	limit := d.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	if len(msg.Body) > limit {
		return Event{}, decodeErr("body", fmt.Sprintf("is %d bytes, over the %d-byte limit", len(msg.Body), limit))
	}
	body := bytes.TrimSpace(msg.Body)
	if ce, ok, err := detectCloudEvent(msg, body); ok {
		if err != nil {
			return Event{}, err
		}
		return decodeCloudEvent(msg, ce)
	}
	if len(body) == 0 {
		return Event{}, decodeErr("body", "is empty")
	}
	var fields map[string]json.RawMessage
	isObject := body[0] == '{' && json.Unmarshal(body, &fields) == nil
	id, hasID := msg.Headers[HeaderEventID]
	if isObject {
		if _, ok := fields["event_id"]; ok && (!hasID || hasEnvelopeShape(fields)) {
			return decodeEnvelope(fields, msg.Headers)
		}
		if _, ok := fields["specversion"]; ok && !hasID {
			// A structured CloudEvent without its content type (the Kafka
			// binding makes the header optional).
			ce, err := structuredFields(fields)
			if err != nil {
				return Event{}, err
			}
			ce.headers = msg.Headers
			return decodeCloudEvent(msg, ce)
		}
	}
	if hasID {
		return decodeDebezium(msg, id, body)
	}
	if !json.Valid(body) {
		return Event{}, decodeErr("body", "is not JSON")
	}
	if !isObject {
		return Event{}, decodeErr("body", "is not a JSON object and there is no \"id\" header")
	}
	return Event{}, decodeErr("event_id", "is missing")
}

// hasEnvelopeShape reports whether fields, an object with an "event_id",
// also have the envelope's "event_name" and "payload". A Debezium record's
// bare payload may hold an "event_id" of its own (an application's field):
// with an "id" header and without that shape, the record is read by its
// headers, as Debezium wrote it. A whole envelope wins over the headers.
func hasEnvelopeShape(fields map[string]json.RawMessage) bool {
	_, name := fields["event_name"]
	_, payload := fields["payload"]
	_, b64 := fields["payload_base64"]
	return name && (payload || b64)
}

func decodeErr(field, problem string) error {
	return &DecodeError{Err: &FieldError{Field: field, Problem: problem}}
}

func decodeEnvelope(f map[string]json.RawMessage, headers map[string]string) (Event, error) {
	var ev Event
	var err error
	if ev.ID, err = parseEventID(f["event_id"], "event_id"); err != nil {
		return Event{}, err
	}
	name, ok, err := stringField(f, "event_name")
	if err != nil {
		return Event{}, err
	}
	if !ok || name == "" {
		return Event{}, decodeErr("event_name", "is missing")
	}
	ev.Name = name
	if at, ok, err := stringField(f, "occurred_at"); err != nil {
		return Event{}, err
	} else if ok && at != "" {
		t, perr := time.Parse(time.RFC3339Nano, at)
		if perr != nil {
			return Event{}, decodeErr("occurred_at", "is not an RFC 3339 time")
		}
		if y := t.UTC().Year(); y < 1 || y > 9999 {
			return Event{}, decodeErr("occurred_at", "is out of range (years 1 to 9999 in UTC)")
		}
		ev.OccurredAt = t.UTC()
	}
	if ev.AggregateType, _, err = stringField(f, "aggregate_type"); err != nil {
		return Event{}, err
	}
	if raw, ok := f["aggregate_id"]; ok && !isNull(raw) {
		// Producers sometimes send numeric ids; keep their text.
		if len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
			var n json.Number
			if json.Unmarshal(raw, &n) != nil {
				return Event{}, decodeErr("aggregate_id", "is neither a string nor a number")
			}
			ev.AggregateID = n.String()
		} else if ev.AggregateID, _, err = stringField(f, "aggregate_id"); err != nil {
			return Event{}, decodeErr("aggregate_id", "is neither a string nor a number")
		}
	}
	if raw, ok := f["aggregate_version"]; ok && !isNull(raw) {
		v, perr := strconv.ParseInt(string(raw), 10, 64)
		if perr != nil || v < 0 {
			return Event{}, decodeErr("aggregate_version", "is not a non-negative integer")
		}
		ev.AggregateVersion = v
	}
	if ev.ContentType, _, err = stringField(f, "content_type"); err != nil {
		return Event{}, err
	}
	if ev.ContentType != "" && !validContentType(ev.ContentType) {
		return Event{}, decodeErr("content_type", fmt.Sprintf("%q is not a media type (type/subtype)", truncate(ev.ContentType, 64)))
	}
	if b64, ok := f["payload_base64"]; ok {
		if ev.ContentType == "" {
			ev.ContentType = ContentTypeOctetStream
		}
		if _, both := f["payload"]; both {
			return Event{}, decodeErr("payload_base64", "is set with payload: an envelope has one or the other")
		}
		if ev.IsJSON() {
			return Event{}, decodeErr("payload_base64", fmt.Sprintf("is set for the JSON content type %q: a JSON payload is \"payload\"", truncate(ev.ContentType, 64)))
		}
		var raw []byte
		if isNull(b64) || json.Unmarshal(b64, &raw) != nil {
			return Event{}, decodeErr("payload_base64", "is not a base64 string")
		}
		ev.Payload = json.RawMessage(raw)
		if ev.Payload == nil {
			ev.Payload = json.RawMessage{}
		}
		ev.Headers = copyHeaders(headers)
		return ev, nil
	}
	if !ev.IsJSON() {
		return Event{}, decodeErr("payload_base64", fmt.Sprintf("is missing: the content type %q is not JSON", truncate(ev.ContentType, 64)))
	}
	payload, ok := f["payload"]
	if !ok {
		return Event{}, decodeErr("payload", "is missing")
	}
	ev.Payload = append(json.RawMessage(nil), payload...)
	ev.Headers = copyHeaders(headers)
	return ev, nil
}

// decodeDebezium reads a record of Debezium's Outbox Event Router. Its "id"
// header, rawID, is the outbox row's id as written (Debezium copies the
// column): it becomes the event id by the rule of EventID, as the relays
// make it of the same row, so that a row is one event whichever path
// published it. A derived id is kept in the event's header
// HeaderOriginalID, as the relays send it.
func decodeDebezium(msg Message, rawID string, body []byte) (Event, error) {
	ev := Event{Name: msg.Headers[HeaderEventType], AggregateType: msg.AggregateType, AggregateID: debeziumKey(msg.Key)}
	if ev.Name == "" {
		ev.Name = msg.EventName
	}
	id, derived, err := decodeEventID("id header", rawID)
	if err != nil {
		// The aggregate is returned with the error: the message is parked
		// holding its aggregate's later events, as the relays hold them
		// behind the row they quarantine for its id.
		return ev, err
	}
	ev.ID = id
	payload, err := debeziumPayload(body)
	if err != nil {
		return Event{}, err
	}
	if ev.Name == "" {
		// What was read is returned with the error, so that the message is
		// parked with its id and aggregate.
		return ev, decodeErr("eventType header", "is missing: the record carries no event name "+
			"(set Debezium's table.fields.additional.placement=type:header:eventType, or give the subscriber a default event name for the topic)")
	}
	ev.Payload = payload
	ev.Headers = copyHeaders(msg.Headers)
	if derived {
		ev.Headers[HeaderOriginalID] = rawID
	}
	return ev, nil
}

// debeziumKey returns the aggregate id from a Debezium record key: raw text,
// a JSON string, or a JSON converter envelope {"schema":…,"payload":"42"}.
func debeziumKey(key []byte) string {
	k := bytes.TrimSpace(key)
	if len(k) == 0 {
		return ""
	}
	switch k[0] {
	case '"':
		var s string
		if json.Unmarshal(k, &s) == nil {
			return s
		}
	case '{':
		var wrapped struct {
			Schema  json.RawMessage `json:"schema"`
			Payload json.RawMessage `json:"payload"`
		}
		if json.Unmarshal(k, &wrapped) == nil && wrapped.Payload != nil {
			return debeziumKey(wrapped.Payload)
		}
	}
	return string(key)
}

// debeziumPayload returns the payload from a Debezium value: bare JSON, a JSON
// string holding JSON, or a JSON converter envelope {"schema":…,"payload":…}.
func debeziumPayload(value []byte) (json.RawMessage, error) {
	for depth := 0; depth < 3; depth++ {
		if !json.Valid(value) {
			return nil, decodeErr("payload", "is not JSON")
		}
		switch value[0] {
		case '"':
			var s string
			if err := json.Unmarshal(value, &s); err != nil {
				return nil, decodeErr("payload", "is not JSON")
			}
			inner := bytes.TrimSpace([]byte(s))
			if len(inner) == 0 || !json.Valid(inner) {
				// A payload that is a JSON string: Debezium's JSON
				// converter quotes the text of a payload column, which
				// holds JSON; a relay writing the bare payload writes the
				// string itself.
				return append(json.RawMessage(nil), value...), nil
			}
			value = inner
			continue
		case '{':
			var wrapped map[string]json.RawMessage
			if json.Unmarshal(value, &wrapped) == nil && len(wrapped) == 2 {
				if _, hasSchema := wrapped["schema"]; hasSchema {
					if p, ok := wrapped["payload"]; ok {
						value = bytes.TrimSpace(p)
						continue
					}
				}
			}
		}
		return append(json.RawMessage(nil), value...), nil
	}
	return append(json.RawMessage(nil), value...), nil
}

func parseEventID(raw json.RawMessage, field string) (uuid.UUID, error) {
	if isNull(raw) {
		return uuid.Nil, decodeErr(field, "is missing")
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return uuid.Nil, decodeErr(field, "is not a string")
	}
	return parseEventIDString(s, field)
}

func parseEventIDString(s, field string) (uuid.UUID, error) {
	if s == "" {
		return uuid.Nil, decodeErr(field, "is missing")
	}
	// uuid.Parse also accepts braces and urn: prefixes; the wire contract is
	// the 36-character form only.
	if len(s) != 36 {
		return uuid.Nil, decodeErr(field, fmt.Sprintf("is not a UUID: %q", truncate(s, 64)))
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, decodeErr(field, fmt.Sprintf("is not a UUID: %q", truncate(s, 64)))
	}
	if id == uuid.Nil {
		return uuid.Nil, decodeErr(field, "is the nil UUID")
	}
	return id, nil
}

func stringField(f map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := f[name]
	if !ok || isNull(raw) {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", true, decodeErr(name, "is not a string")
	}
	return s, true, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func copyHeaders(h map[string]string) map[string]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[k] = v
	}
	return out
}
