package dashboard_test

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

func cloneValues(v url.Values) url.Values {
	c := url.Values{}
	for k, vs := range v {
		c[k] = append([]string(nil), vs...)
	}
	return c
}

func redisFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func bufCopy(w *strings.Builder, res *http.Response) (int64, error) {
	defer res.Body.Close()
	return io.Copy(w, res.Body)
}
