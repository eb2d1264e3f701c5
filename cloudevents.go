package idem

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// CloudEventsMode is how a message carries a CloudEvent: its content mode.
type CloudEventsMode int

// CloudEvents content modes.
const (
	// CloudEventsBinary puts the event's data (the payload: JSON, or the
	// raw bytes of another content type) in the body and every other attribute in a transport header, named as the
	// transport's protocol binding says (CloudEventsBinding). It is the
	// default.
	CloudEventsBinary CloudEventsMode = iota
	// CloudEventsStructured puts the whole event in the body, in the JSON
	// event format, with the content type application/cloudevents+json.
	CloudEventsStructured
)

// String returns "binary" or "structured".
func (m CloudEventsMode) String() string {
	switch m {
	case CloudEventsBinary:
		return "binary"
	case CloudEventsStructured:
		return "structured"
	}
	return fmt.Sprintf("CloudEventsMode(%d)", int(m))
}

// CloudEvents constants.
const (
	// CloudEventsSpecVersion is the specversion idem writes and reads.
	CloudEventsSpecVersion = "1.0"
	// ContentTypeCloudEventsJSON is the content type of a structured
	// CloudEvent in the JSON event format.
	ContentTypeCloudEventsJSON = "application/cloudevents+json"
	// HeaderContentType is the header that carries a message's content
	// type on Kafka, and, in idem.Message, on RabbitMQ too (where the
	// transport maps it to and from the AMQP content-type property when it
	// is not application/json).
	HeaderContentType = "content-type"
	// CloudEventsSourceDefault is the start of the source attribute when
	// CloudEvents.Source is empty: the aggregate type follows it
	// ("/idem/order").
	CloudEventsSourceDefault = "/idem/"
	// CloudEventsAggregateType is the extension attribute that carries the
	// aggregate type.
	CloudEventsAggregateType = "aggregatetype"
	// CloudEventsAggregateVersion is the extension attribute that carries
	// the aggregate version, when the producer tracks one.
	CloudEventsAggregateVersion = "aggregateversion"
	// CloudEventsHeaderPrefix starts the names of the Event.Headers that
	// hold the attributes of a received CloudEvent ("ce_source").
	CloudEventsHeaderPrefix = "ce_"
)

// CloudEventsBinding is how a transport carries a CloudEvent in binary
// content mode: CloudEventsKafka, CloudEventsAMQP or CloudEventsNATS.
type CloudEventsBinding struct {
	// Name names the binding in errors ("kafka").
	Name string
	// Prefix starts the name of the header of each attribute.
	Prefix string
	// ContentTypeHeader is the header of the content type: the event
	// format's in structured mode; in binary mode datacontenttype, unless
	// DataContentTypeAsAttribute.
	ContentTypeHeader string
	// DataContentTypeAsAttribute carries datacontenttype under Prefix like
	// every other attribute, in binary mode (NATS).
	DataContentTypeAsAttribute bool
	// PercentEncode percent-encodes header values (NATS, as HTTP).
	PercentEncode bool
}

// The protocol bindings of idem's transports.
var (
	// CloudEventsKafka is the Kafka protocol binding: headers "ce_<name>",
	// datacontenttype in the header "content-type".
	CloudEventsKafka = CloudEventsBinding{Name: "kafka", Prefix: "ce_", ContentTypeHeader: HeaderContentType}
	// CloudEventsAMQP is the AMQP protocol binding: application properties
	// (RabbitMQ headers) "cloudEvents_<name>", datacontenttype in the AMQP
	// content-type property (HeaderContentType in idem.Message). On
	// receipt "cloudEvents:<name>" is accepted too.
	CloudEventsAMQP = CloudEventsBinding{Name: "amqp", Prefix: "cloudEvents_", ContentTypeHeader: HeaderContentType}
	// CloudEventsNATS is the NATS protocol binding: headers "ce-<name>",
	// datacontenttype included ("ce-datacontenttype"), values
	// percent-encoded; the header "Content-Type" marks structured mode.
	CloudEventsNATS = CloudEventsBinding{Name: "nats", Prefix: "ce-", ContentTypeHeader: "Content-Type",
		DataContentTypeAsAttribute: true, PercentEncode: true}
)

// CloudEvents configures the CloudEvents 1.0 encoding of messages, for the
// transports' publishers (amqp.PublisherConfig.CloudEvents,
// kafka.PublisherConfig.CloudEvents, nats.PublisherConfig.CloudEvents).
// The Decoder reads CloudEvents in both modes on every transport whatever
// the publishers do.
//
// The mapping:
//
//	id                event id (a UUID)
//	source            Source, by default "/idem/<aggregate type>"
//	specversion       "1.0"
//	type              event name
//	datacontenttype   the event's ContentType, by default "application/json"
//	subject           aggregate id
//	time              occurred_at, RFC 3339 in UTC with microseconds
//	aggregatetype     aggregate type (extension)
//	aggregateversion  aggregate version, when above 0 (extension, Integer)
//	traceparent       the message's header traceparent, when set
//	tracestate        the message's header tracestate, when set
//	data              the payload
//
// A payload that is not JSON (Event.ContentType) is the body as it is in
// binary mode, with no base64: the natural wire for Protobuf or Avro. In
// structured mode it is data_base64, as the JSON event format says.
//
// The message's other headers (idem-original-id, baggage, the
// application's) are carried as they are, as transport headers.
type CloudEvents struct {
	// Mode is CloudEventsBinary (the default) or CloudEventsStructured.
	Mode CloudEventsMode
	// Source is the source attribute of every event: a URI-reference
	// naming the context the events come from ("/shop/order",
	// "https://shop.example.com/order", "urn:shop:order"). Defaults to
	// CloudEventsSourceDefault followed by the event's aggregate type,
	// path-escaped ("/idem/order"). idem's event ids are UUIDs, unique
	// whatever the source.
	Source string
}

// Validate reports a Mode that is not one of the modes, or a Source that
// is not a URI-reference.
func (c CloudEvents) Validate() error {
	if c.Mode != CloudEventsBinary && c.Mode != CloudEventsStructured {
		return fmt.Errorf("idem: CloudEvents.Mode %d: want CloudEventsBinary or CloudEventsStructured", int(c.Mode))
	}
	if c.Source != "" {
		if err := checkURIReference(c.Source); err != nil {
			return fmt.Errorf("idem: CloudEvents.Source %q %s", c.Source, err.Error())
		}
	}
	return nil
}

func checkURIReference(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return errors.New("is not a URI-reference: it holds a space or a control character")
		}
	}
	if _, err := url.Parse(s); err != nil {
		return errors.New("is not a URI-reference")
	}
	return nil
}

// cloudEventsDecoder reads what publishers are given: no size limit, the
// broker has its own.
var cloudEventsDecoder = Decoder{MaxBodyBytes: int(^uint(0) >> 1)}

// Encode returns msg as a CloudEvent carried as binding b says. msg is
// what a relay publishes (an idem envelope), or any message the Decoder
// reads (a Debezium record, a CloudEvent in either mode); its event id,
// name, aggregate type and key are kept, for the transport's own routing
// and ids. A message the Decoder cannot read is an error that wraps
// ErrUndecodable.
func (c CloudEvents) Encode(msg Message, b CloudEventsBinding) (Message, error) {
	ev, err := cloudEventsDecoder.Decode(msg)
	if err != nil {
		return Message{}, fmt.Errorf("idem: encode CloudEvent: %w", err)
	}
	out, err := c.EncodeEvent(ev, b)
	if err != nil {
		return Message{}, err
	}
	out.EventName, out.AggregateType, out.Key = msg.EventName, msg.AggregateType, msg.Key
	if out.EventName == "" {
		out.EventName = ev.Name
	}
	if out.AggregateType == "" {
		out.AggregateType = ev.AggregateType
	}
	if len(out.Key) == 0 {
		out.Key = []byte(ev.AggregateID)
	}
	return out, nil
}

// ceAttr is one attribute, in the order written.
type ceAttr struct {
	name, value string
	integer     bool // written as a JSON number in structured mode
}

// attributes returns ev's attributes but data, in the order written.
func (c CloudEvents) attributes(ev Event) []ceAttr {
	source := c.Source
	if source == "" {
		source = CloudEventsSourceDefault + url.PathEscape(ev.AggregateType)
	}
	attrs := make([]ceAttr, 0, 11)
	attrs = append(attrs,
		ceAttr{name: "specversion", value: CloudEventsSpecVersion},
		ceAttr{name: "id", value: ev.ID.String()},
		ceAttr{name: "source", value: source},
		ceAttr{name: "type", value: ev.Name})
	if !ev.OccurredAt.IsZero() {
		attrs = append(attrs, ceAttr{name: "time", value: ev.OccurredAt.UTC().Format(OccurredAtLayout)})
	}
	if ev.AggregateID != "" {
		attrs = append(attrs, ceAttr{name: "subject", value: ev.AggregateID})
	}
	attrs = append(attrs, ceAttr{name: "datacontenttype", value: cmp.Or(ev.ContentType, ContentTypeJSON)})
	if ev.AggregateType != "" {
		attrs = append(attrs, ceAttr{name: CloudEventsAggregateType, value: ev.AggregateType})
	}
	if ev.AggregateVersion > 0 {
		attrs = append(attrs, ceAttr{name: CloudEventsAggregateVersion, value: strconv.FormatInt(ev.AggregateVersion, 10), integer: true})
	}
	for _, name := range [...]string{"traceparent", "tracestate"} {
		if v, ok := headerFold(ev.Headers, name); ok && v != "" {
			attrs = append(attrs, ceAttr{name: name, value: v})
		}
	}
	return attrs
}

// EncodeEvent returns ev as a CloudEvent carried as binding b says, with
// the transport fields of a message made by NewMessage (event id, name,
// aggregate type, key). An event header named as a CloudEvents attribute
// in any binding ("ce_tenant", "ce-tenant", "cloudEvents_tenant") is an
// extension attribute, unless it names an attribute written from the event
// (specversion, id, source, type, time, subject, datacontenttype,
// aggregatetype, aggregateversion, traceparent, tracestate), which is left
// out, as is a content type header: so an outbox row's header "ce_tenant"
// publishes the extension tenant, and a received CloudEvent's extensions
// (its Event.Headers "ce_<name>") are published again.
func (c CloudEvents) EncodeEvent(ev Event, b CloudEventsBinding) (Message, error) {
	if err := c.Validate(); err != nil {
		return Message{}, err
	}
	if err := ev.Validate(); err != nil {
		return Message{}, fmt.Errorf("idem: encode CloudEvent: %w", err)
	}
	data := []byte("null")
	binary := !ev.IsJSON()
	if binary {
		data = ev.Payload
		if data == nil {
			data = []byte{}
		}
	} else if len(bytes.TrimSpace(ev.Payload)) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, ev.Payload); err != nil {
			return Message{}, fmt.Errorf("idem: encode CloudEvent: %w", &FieldError{Field: "payload", Problem: "is not valid JSON"})
		}
		data = buf.Bytes()
	}
	attrs := c.attributes(ev)
	headers := make(map[string]string, len(ev.Headers)+len(attrs)+1)
	var extensions map[string]string
	for k, v := range ev.Headers {
		if _, name, isAttr := cloudEventsHeader(k); isAttr {
			if IsCloudEventsAttributeName(name) && !isWrittenAttribute(name) {
				if extensions == nil {
					extensions = make(map[string]string)
				}
				if old, dup := extensions[name]; !dup || k < old {
					extensions[name] = k // the first header name, sorted, wins
				}
			}
			continue
		}
		if strings.EqualFold(k, HeaderContentType) {
			continue
		}
		headers[k] = v
	}
	if len(extensions) > 0 {
		names := make([]string, 0, len(extensions))
		for name := range extensions {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			attrs = append(attrs, ceAttr{name: name, value: ev.Headers[extensions[name]]})
		}
	}
	msg := Message{
		EventID:       ev.ID,
		EventName:     ev.Name,
		AggregateType: ev.AggregateType,
		Key:           []byte(ev.AggregateID),
		Headers:       headers,
	}
	if c.Mode == CloudEventsStructured {
		headers[b.ContentTypeHeader] = ContentTypeCloudEventsJSON
		body := make([]byte, 0, 256+len(data))
		body = append(body, '{')
		for i, a := range attrs {
			if i > 0 {
				body = append(body, ',')
			}
			body = appendJSONString(body, a.name)
			body = append(body, ':')
			if a.integer {
				body = append(body, a.value...)
			} else {
				body = appendJSONString(body, a.value)
			}
		}
		if binary {
			body = append(body, `,"data_base64":"`...)
			body = base64.StdEncoding.AppendEncode(body, data)
			msg.Body = append(body, `"}`...)
			return msg, nil
		}
		body = append(body, `,"data":`...)
		body = append(body, data...)
		msg.Body = append(body, '}')
		return msg, nil
	}
	for _, a := range attrs {
		if a.name == "datacontenttype" && !b.DataContentTypeAsAttribute {
			headers[b.ContentTypeHeader] = a.value
			continue
		}
		v := a.value
		if b.PercentEncode {
			v = percentEncode(v)
		}
		headers[b.Prefix+a.name] = v
	}
	msg.Body = data
	return msg, nil
}

// headerFold returns the value of the header named name in any case.
func headerFold(h map[string]string, name string) (string, bool) {
	if v, ok := h[name]; ok {
		return v, true
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// cloudEventsPrefixes are the header prefixes of the bindings, in the
// order the Decoder tries them, lower-cased.
var cloudEventsPrefixes = [...]string{"ce_", "ce-", "cloudevents_", "cloudevents:"}

// cloudEventsHeader reports whether header k names a CloudEvents attribute
// in binary mode, and returns its prefix (lower-cased, one of
// cloudEventsPrefixes) and the attribute's name (lower-cased).
func cloudEventsHeader(k string) (prefix, name string, ok bool) {
	for _, p := range cloudEventsPrefixes {
		if len(k) > len(p) && strings.EqualFold(k[:len(p)], p) {
			return p, strings.ToLower(k[len(p):]), true
		}
	}
	return "", "", false
}

// IsCloudEventsAttributeName reports whether name is a valid CloudEvents
// attribute name: 1 to 20 lower-case ASCII letters or digits. (The
// specification requires the letters and digits and recommends the
// length; idem requires both.)
func IsCloudEventsAttributeName(name string) bool {
	if name == "" || len(name) > 20 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// percentEncode encodes a header value as the NATS and HTTP bindings say:
// space, double quote, percent and every byte outside printable ASCII
// become %XY.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for i := 0; i < len(s); i++ {
		if needsPercent(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	out := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsPercent(c) {
			out = append(out, '%', hex[c>>4], hex[c&0xf])
		} else {
			out = append(out, c)
		}
	}
	return string(out)
}

func needsPercent(c byte) bool { return c <= ' ' || c == '"' || c == '%' || c >= 0x7f }

// percentDecode undoes percentEncode, after unquoting a value in double
// quotes (RFC 7230 quoted-string), as the NATS and HTTP bindings say. The
// result must be valid UTF-8.
func percentDecode(s string) (string, error) {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		var b strings.Builder
		for i := 1; i < len(s)-1; i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s)-1 {
				i++
				c = s[i]
			}
			b.WriteByte(c)
		}
		s = b.String()
	}
	if strings.IndexByte(s, '%') < 0 {
		if !utf8.ValidString(s) {
			return "", errors.New("is not valid UTF-8")
		}
		return s, nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			out = append(out, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("has a truncated percent-encoding")
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("has an invalid percent-encoding %q", s[i:i+3])
		}
		out = append(out, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(out) {
		return "", errors.New("is not valid UTF-8 once percent-decoded")
	}
	return string(out), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// mediaType returns the media type of a content type, lower-cased, without
// parameters.
func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// isJSONMediaType reports whether a media type says JSON: application/json,
// text/json, or a +json suffix.
func isJSONMediaType(mt string) bool {
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// ceMessage is a received CloudEvent before its checks: its attributes as
// strings (structured mode: extension numbers and booleans in their JSON
// text) and its data.
type ceMessage struct {
	attrs map[string]string
	data  []byte // the body, JSON text or data_base64's bytes; nil when the event has none
	// dataMember is true when data is the structured format's member
	// "data": JSON text, a JSON string when the content type is not JSON.
	dataMember bool
	// headers are the message's headers that are not attributes.
	headers map[string]string
}

// detectCloudEvent returns the CloudEvent msg carries, if it carries one:
// in structured mode when its content type starts with
// application/cloudevents, in binary mode when it has a header of a
// binding for specversion, id, source or type. ok false means msg is no CloudEvent (for these two
// rules); an error means it is one, and undecodable.
func detectCloudEvent(msg Message, body []byte) (ce ceMessage, ok bool, err error) {
	var ctKey, ct string
	for k, v := range msg.Headers {
		if strings.EqualFold(k, HeaderContentType) {
			ctKey, ct = k, v
			break
		}
	}
	if mt := mediaType(ct); strings.HasPrefix(mt, "application/cloudevents") {
		if mt != ContentTypeCloudEventsJSON && mt != "application/cloudevents" {
			return ce, true, decodeErr("content type", fmt.Sprintf("%q is not the JSON event format (%s): idem reads no other", truncate(ct, 64), ContentTypeCloudEventsJSON))
		}
		ce, err = parseStructured(body)
		if err != nil {
			return ce, true, err
		}
		ce.headers = make(map[string]string, len(msg.Headers))
		for k, v := range msg.Headers {
			if k != ctKey {
				ce.headers[k] = v
			}
		}
		return ce, true, nil
	}
	// A message with a header of a required attribute is taken for a
	// CloudEvent, so that one without specversion is told so.
	prefix := ""
	for _, p := range cloudEventsPrefixes {
		for k := range msg.Headers {
			if hp, name, isAttr := cloudEventsHeader(k); isAttr && hp == p && isRequiredAttribute(name) {
				prefix = p
				break
			}
		}
		if prefix != "" {
			break
		}
	}
	if prefix == "" {
		return ce, false, nil
	}
	ce.attrs = make(map[string]string, 8)
	ce.headers = make(map[string]string, len(msg.Headers))
	for k, v := range msg.Headers {
		p, name, isAttr := cloudEventsHeader(k)
		if !isAttr || p != prefix {
			if k != ctKey {
				ce.headers[k] = v
			}
			continue
		}
		if !IsCloudEventsAttributeName(name) {
			return ce, true, decodeErr(fmt.Sprintf("header %q", truncate(k, 64)), "does not name a CloudEvents attribute (1 to 20 lower-case letters or digits)")
		}
		if name == "data" {
			return ce, true, decodeErr(fmt.Sprintf("header %q", truncate(k, 64)), "carries data, which binary mode carries in the body")
		}
		if prefix == "ce-" {
			dv, derr := percentDecode(v)
			if derr != nil {
				return ce, true, decodeErr(name, derr.Error())
			}
			v = dv
		} else if !utf8.ValidString(v) {
			return ce, true, decodeErr(name, "is not valid UTF-8")
		}
		if _, dup := ce.attrs[name]; dup {
			return ce, true, decodeErr(name, "appears twice, in headers of different case")
		}
		ce.attrs[name] = v
	}
	if _, has := ce.attrs["datacontenttype"]; !has && ct != "" {
		ce.attrs["datacontenttype"] = ct
	}
	if len(body) > 0 {
		// The body as received: data that is not JSON may begin or end
		// with bytes that look like white space.
		ce.data = msg.Body
	}
	return ce, true, nil
}

// parseStructured reads the JSON event format.
func parseStructured(body []byte) (ceMessage, error) {
	var fields map[string]json.RawMessage
	if len(body) == 0 || body[0] != '{' || json.Unmarshal(body, &fields) != nil {
		return ceMessage{}, decodeErr("body", "is not a JSON object (the JSON event format)")
	}
	return structuredFields(fields)
}

func structuredFields(fields map[string]json.RawMessage) (ceMessage, error) {
	ce := ceMessage{attrs: make(map[string]string, len(fields))}
	var b64 json.RawMessage
	for name, raw := range fields {
		switch name {
		case "data":
			if !isNull(raw) {
				ce.data = raw
				ce.dataMember = true
			}
			continue
		case "data_base64":
			b64 = raw
			continue
		}
		if !IsCloudEventsAttributeName(name) {
			return ce, decodeErr(fmt.Sprintf("member %q", truncate(name, 64)), "does not name a CloudEvents attribute (1 to 20 lower-case letters or digits)")
		}
		if isNull(raw) {
			continue // an absent attribute
		}
		switch raw[0] {
		case '"':
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return ce, decodeErr(name, "is not a valid JSON string")
			}
			ce.attrs[name] = s
		case 't', 'f':
			ce.attrs[name] = string(raw)
			if isCoreAttribute(name) {
				return ce, decodeErr(name, "is not a string")
			}
		default:
			if raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9' {
				if isCoreAttribute(name) {
					return ce, decodeErr(name, "is not a string")
				}
				ce.attrs[name] = string(raw)
				continue
			}
			return ce, decodeErr(name, "is neither a string, a number nor a boolean")
		}
	}
	if b64 != nil && !isNull(b64) {
		if ce.data != nil {
			return ce, decodeErr("data_base64", "is set with data: an event has one or the other")
		}
		var raw []byte
		if json.Unmarshal(b64, &raw) != nil {
			return ce, decodeErr("data_base64", "is not a base64 string")
		}
		ce.data = raw
		if len(ce.data) == 0 {
			ce.data = nil
		}
	}
	return ce, nil
}

// isWrittenAttribute reports whether EncodeEvent writes the attribute
// name from the event, whatever its headers say.
func isWrittenAttribute(name string) bool {
	switch name {
	case "specversion", "id", "source", "type", "time", "subject", "datacontenttype",
		CloudEventsAggregateType, CloudEventsAggregateVersion, "traceparent", "tracestate", "data":
		return true
	}
	return false
}

func isRequiredAttribute(name string) bool {
	return name == "specversion" || name == "id" || name == "source" || name == "type"
}

// isCoreAttribute reports whether name is an attribute of the
// specification itself, all of them strings.
func isCoreAttribute(name string) bool {
	switch name {
	case "specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time":
		return true
	}
	return false
}

// decodeCloudEvent turns a received CloudEvent into an event, by the
// mapping of CloudEvents. On an error, the event holds what could be read
// (its id and aggregate), for the failure store.
func decodeCloudEvent(msg Message, ce ceMessage) (Event, error) {
	var ev Event
	required := func(name string) (string, error) {
		v := ce.attrs[name]
		if v == "" {
			return "", decodeErr(name, "is missing: a CloudEvent has specversion, id, source and type")
		}
		return v, nil
	}
	sv, err := required("specversion")
	if err != nil {
		return ev, err
	}
	if sv != CloudEventsSpecVersion {
		return ev, decodeErr("specversion", fmt.Sprintf("%q is not supported: idem reads CloudEvents %s", truncate(sv, 16), CloudEventsSpecVersion))
	}
	rawID, err := required("id")
	if err != nil {
		return ev, err
	}
	id, derived, err := decodeEventID("id", rawID)
	if err != nil {
		return ev, err
	}
	ev.ID = id
	ev.AggregateID = ce.attrs["subject"]
	if ev.AggregateID == "" {
		ev.AggregateID = debeziumKey(msg.Key)
	}
	ev.AggregateType = ce.attrs[CloudEventsAggregateType]
	if ev.AggregateType == "" {
		ev.AggregateType = msg.AggregateType
	}
	source, err := required("source")
	if err != nil {
		return ev, err
	}
	if err := checkURIReference(source); err != nil {
		return ev, decodeErr("source", fmt.Sprintf("%q %s", truncate(source, 64), err.Error()))
	}
	if ev.Name, err = required("type"); err != nil {
		return ev, err
	}
	if at := ce.attrs["time"]; at != "" {
		t, perr := parseRFC3339(at)
		if perr != nil {
			return ev, decodeErr("time", fmt.Sprintf("%q is not an RFC 3339 timestamp", truncate(at, 64)))
		}
		ev.OccurredAt = t
	}
	if v := ce.attrs[CloudEventsAggregateVersion]; v != "" {
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || n < 0 {
			return ev, decodeErr(CloudEventsAggregateVersion, fmt.Sprintf("%q is not a non-negative integer", truncate(v, 32)))
		}
		ev.AggregateVersion = n
	}
	data := bytes.TrimSpace(ce.data)
	if ct := ce.attrs["datacontenttype"]; ct != "" && !IsJSONContentType(ct) {
		if !validContentType(ct) {
			return ev, decodeErr("datacontenttype", fmt.Sprintf("%q is not a media type (type/subtype)", truncate(ct, 64)))
		}
		ev.ContentType = ct
		switch {
		case ce.dataMember && len(data) > 0 && data[0] == '"':
			// The JSON event format carries data of a type that is not
			// JSON as a JSON string (text), or in data_base64 (bytes).
			var s string
			if json.Unmarshal(data, &s) != nil {
				return ev, decodeErr("data", "is not a valid JSON string")
			}
			ev.Payload = json.RawMessage(s)
		case ce.dataMember:
			return ev, decodeErr("data", fmt.Sprintf("is JSON that is not a string, for the content type %q: "+
				"the JSON event format carries such data as a string or in data_base64", truncate(ct, 64)))
		default:
			// The bytes as received, not trimmed.
			ev.Payload = append(json.RawMessage{}, ce.data...)
		}
	} else {
		switch {
		case len(data) == 0:
			ev.Payload = json.RawMessage("null")
		case !json.Valid(data):
			return ev, decodeErr("data", "is not JSON")
		default:
			ev.Payload = append(json.RawMessage(nil), data...)
		}
	}
	ev.Headers = make(map[string]string, len(ce.headers)+len(ce.attrs)+1)
	for k, v := range ce.headers {
		ev.Headers[k] = v
	}
	for name, v := range ce.attrs {
		ev.Headers[CloudEventsHeaderPrefix+name] = v
	}
	for _, name := range [...]string{"traceparent", "tracestate"} {
		if v := ce.attrs[name]; v != "" {
			if _, own := headerFold(ce.headers, name); !own {
				ev.Headers[name] = v
			}
		}
	}
	if derived {
		ev.Headers[HeaderOriginalID] = rawID
	}
	return ev, nil
}

// parseRFC3339 parses an RFC 3339 timestamp (the letters T and Z in either
// case), in UTC, years 1 to 9999.
func parseRFC3339(s string) (time.Time, error) {
	if len(s) > 10 && s[10] == 't' {
		s = s[:10] + "T" + s[11:]
	}
	if n := len(s); n > 0 && s[n-1] == 'z' {
		s = s[:n-1] + "Z"
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, err
	}
	t = t.UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, errors.New("out of range")
	}
	return t, nil
}
