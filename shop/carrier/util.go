package carrier

import (
	"bytes"
	"io"
	"net/url"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
