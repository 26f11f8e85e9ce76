package admin

import (
	"context"
	"net/http"
	"strings"
)

// New returns a client of the admin API at baseURL (e.g.
// "https://tollgate.example.com") that sends token as its bearer token on
// every request, through httpClient (http.DefaultClient when nil). The
// answers are parsed by status: JSON200, JSON201, ApplicationproblemJSON4xx
// and the like of each operation's response.
func New(baseURL, token string, httpClient *http.Client) (*ClientWithResponses, error) {
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	return NewClientWithResponses(strings.TrimRight(baseURL, "/"),
		WithHTTPClient(httpClient),
		WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+token)
			return nil
		}))
}
