package main

import "testing"

func TestLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8080", true},
		{"http://127.9.9.9:1", true},
		{"http://[::1]:8080", true},
		{"http://localhost:8080", true},
		{"http://10.0.0.1:8080", false},
		{"http://192.168.1.2", false},
		{"http://example.com", false},
	} {
		if err := loopbackOnly(tc.url); (err == nil) != tc.ok {
			t.Errorf("loopbackOnly(%q) = %v, want ok=%t", tc.url, err, tc.ok)
		}
	}
}
