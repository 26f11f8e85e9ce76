package redisfn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/lua"
)

// TestLibraryIsLoadedWithEveryFunction: LoadFunctions gives Redis the
// library, named for its version, with every function of functions (the
// read-only ones flagged no-writes), built from every file of lua/; loading
// it again changes nothing.
func TestLibraryIsLoadedWithEveryFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	for range 2 {
		if err := r.LoadFunctions(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	v := strings.TrimPrefix(lib.name, libraryPrefix)
	if len(v) != 12 || strings.Trim(v, "0123456789abcdef") != "" {
		t.Fatalf("library %q: want tollgate_ and 12 hex digits", lib.name)
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST %s: %v, %v", lib.name, libs, err)
	}
	got := map[string][]string{}
	for _, f := range libs[0].Functions {
		got[f.Name] = f.Flags
	}
	for i, f := range functions {
		flags, ok := got[lib.names[i]]
		if !ok {
			t.Errorf("function %s is not in the library", lib.names[i])
			continue
		}
		if want := f.readOnly; slices.Contains(flags, "no-writes") != want {
			t.Errorf("function %s: flags %v, want no-writes %t", lib.names[i], flags, want)
		}
		if lib.names[i] != "tg"+v+"_"+f.name {
			t.Errorf("function %q: want tg%s_%s", lib.names[i], v, f.name)
		}
	}
	if len(got) != len(functions) {
		t.Errorf("the library has %d functions, want %d: %v", len(got), len(functions), got)
	}
	files, err := fs.Glob(lua.FS, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.Contains(lib.text, "\n-- ==== lua/"+f+" ====\n") {
			t.Errorf("lua/%s is not in the library", f)
		}
	}
}

// TestLibraryVersionIsItsText: the version is the hash of the text, so a
// change of any file is another library, which a node of another release
// does not call.
func TestLibraryVersionIsItsText(t *testing.T) {
	t.Parallel()
	again := buildLibrary("")
	if again.name != lib.name || again.text != lib.text {
		t.Fatalf("the library is not built the same twice: %s, %s", again.name, lib.name)
	}
	if !strings.HasPrefix(lib.text, "#!lua name="+lib.name+"\n") {
		t.Errorf("the library's first line %q, want #!lua name=%s", strings.SplitN(lib.text, "\n", 2)[0], lib.name)
	}
	if strings.Contains(lib.text, versionMark) {
		t.Errorf("the library holds %s", versionMark)
	}
}

// TestLoadFunctionsNamesOtherReleases: a library of another release (a
// rolling upgrade left it) is found and left in place.
func TestLoadFunctionsNamesOtherReleases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testenv.Redis(t)
	r := New(c, testenv.Prefix(t, c))
	old := libraryPrefix + "0000" + testenv.RandomHex(4)
	if err := c.FunctionLoad(ctx, "#!lua name="+old+"\nredis.register_function('tg_"+old+"', function() return 1 end)\n").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.FunctionDelete(context.Background(), old) })
	if err := r.LoadFunctions(ctx, nil); err != nil {
		t.Fatal(err)
	}
	others, err := r.OtherLibraries(ctx)
	if err != nil || !slices.Contains(others, old) || slices.Contains(others, lib.name) {
		t.Errorf("other libraries: %v, %v; want %s among them, not %s", others, err, old, lib.name)
	}
}

// fakeOldRedis answers every command on a loopback port as Redis 6.2
// answers FUNCTION (an unknown command), and returns a client of it.
func fakeOldRedis(t *testing.T) *redis.Client {
	t.Helper()
	addr := testenv.ServeConns(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			// a command: *<n>, then n times $<len> and that many
			// bytes (the library's text holds line ends) and CRLF
			line, err := r.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "*") {
				return
			}
			n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
			var args []string
			for range n {
				head, err := r.ReadString('\n')
				if err != nil || !strings.HasPrefix(head, "$") {
					return
				}
				size, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
				arg := make([]byte, size+2)
				if _, err := io.ReadFull(r, arg); err != nil {
					return
				}
				args = append(args, string(arg[:size]))
			}
			fmt.Fprintf(c, "-ERR unknown command `%s`, with args beginning with: \r\n", args[0])
		}
	})
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestLoadFunctionsOnRedisWithoutFunctions: a Redis older than 7.0 stops
// the node at its start with ErrNoFunctions; a Redis that does not answer
// (a master down) does not: the failure is logged, and calls load the
// library when they can.
func TestLoadFunctionsOnRedisWithoutFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	err := New(fakeOldRedis(t), "tg").LoadFunctions(ctx, nil)
	if !errors.Is(err, ErrNoFunctions) || !strings.Contains(err.Error(), "Redis 7.0 or later") {
		t.Errorf("on Redis 6: %v, want ErrNoFunctions", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there
	down := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer down.Close()
	var logged bytes.Buffer
	if err := New(down, "tg").LoadFunctions(ctx, slog.New(slog.NewTextHandler(&logged, nil))); err != nil {
		t.Errorf("with Redis down: %v, want nil (the calls load the library)", err)
	}
	if !strings.Contains(logged.String(), "level=WARN") {
		t.Errorf("with Redis down, logged %q, want a warning", logged.String())
	}
}
