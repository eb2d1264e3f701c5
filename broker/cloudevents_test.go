package broker_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

func TestCloudEventsFromURL(t *testing.T) {
	t.Parallel()
	for query, want := range map[string]*idem.CloudEvents{
		"":                       nil,
		"other=1":                nil,
		"cloudevents=binary":     {Mode: idem.CloudEventsBinary},
		"cloudevents=structured": {Mode: idem.CloudEventsStructured},
		"cloudevents=binary&cloudevents_source=%2Fshop%2Forder": {Mode: idem.CloudEventsBinary, Source: "/shop/order"},
	} {
		q, _ := url.ParseQuery(query)
		got, err := broker.CloudEventsFromURL(q)
		if err != nil || (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("%q: %+v %v, want %+v", query, got, err, want)
		}
	}
	for query, mention := range map[string]string{
		"cloudevents=":                                   "cloudevents=\"\"",
		"cloudevents=Binary":                             "cloudevents=\"Binary\"",
		"cloudevents_source=/x":                          "without cloudevents=",
		"cloudevents=binary&cloudevents_source=":         "cloudevents_source is empty",
		"cloudevents=binary&cloudevents_source=%2Fa%20b": "cloudevents_source=\"/a b\"",
	} {
		q, _ := url.ParseQuery(query)
		if _, err := broker.CloudEventsFromURL(q); err == nil || !strings.Contains(err.Error(), mention) {
			t.Errorf("%q: %v, want an error with %q", query, err, mention)
		}
	}
}
