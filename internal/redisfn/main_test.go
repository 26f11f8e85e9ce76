package redisfn

import (
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// The loopback Redis Cluster is shared by every test of the binary, so
	// it is stopped here rather than in one test's cleanup.
	testenv.StopCluster()
	os.Exit(code)
}
