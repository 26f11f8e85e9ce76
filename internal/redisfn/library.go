package redisfn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/lua"
)

// The Redis Function library. Every script of lua/ is a function of one
// library (lua/embed.go), loaded with FUNCTION LOAD on every master and
// called with FCALL: the library's definitions are made once per load, not
// on every call, as an EVALSHA script's are.
//
// The library is named for its version, tollgate_<v>, and so is each of
// its functions, tg<v>_<name>, where <v> is the first 12 hex digits of the
// SHA-256 of the library's text (with the version left out of it): two
// releases' libraries live side by side in Redis during a rolling upgrade,
// and neither calls the other's code. A node never deletes a library (an
// older node may still call it); FUNCTION DELETE removes an old release's
// once none of its nodes runs (docs/operations/redis.md).

// Fn names a function of the library.
type Fn uint8

// The library's functions, each in the file functions names (one Fn a
// function; fnCount counts them).
const (
	FnAdmit Fn = iota
	FnAdmitN
	FnGrant
	FnRefund
	FnSettle
	FnReset
	FnOutage
	FnRestore
	FnRestoreMeters
	FnRestorePrepaid
	FnClaim
	FnFinish
	FnPending
	FnIdem
	FnPolicyRun
	FnMeterPeek
	FnSpendPeek
	fnCount
)

// functions are the library's functions: the name after tg<v>_, the file
// that defines it (as FN.<name>), and whether it only reads (flag
// no-writes: Redis runs it on a replica, or out of memory).
var functions = [fnCount]struct {
	name, file string
	readOnly   bool
}{
	FnAdmit:          {"admit", "admit.lua", false},
	FnAdmitN:         {"admitn", "group.lua", false},
	FnGrant:          {"grant", "grant.lua", false},
	FnRefund:         {"refund", "refund.lua", false},
	FnSettle:         {"settle", "settle.lua", false},
	FnReset:          {"reset", "reset.lua", false},
	FnOutage:         {"outage", "outage.lua", false},
	FnRestore:        {"restore", "restore.lua", false},
	FnRestoreMeters:  {"restore_meters", "restore_meters.lua", false},
	FnRestorePrepaid: {"restore_prepaid", "restore_prepaid.lua", false},
	FnClaim:          {"claim", "claim.lua", false},
	FnFinish:         {"finish", "finish.lua", false},
	FnPending:        {"pending", "pending.lua", true},
	FnIdem:           {"idem", "idem.lua", false},
	FnPolicyRun:      {"policy_run", "policy_run.lua", false},
	FnMeterPeek:      {"meter_peek", "peek.lua", true},
	FnSpendPeek:      {"spend_peek", "peek.lua", true},
}

// sharedFiles hold what the functions share, in the order they build on
// one another; they come first in the library.
var sharedFiles = []string{"calendar.lua", "state.lua", "pending_fields.lua", "meterq.lua", "adjust.lua",
	"policy.lua", "policy_windows.lua", "policy_rates.lua"}

// libraryPrefix starts the name of every release's library.
const libraryPrefix = "tollgate_"

// library is the Function library of this build.
type library struct {
	name  string          // tollgate_<v>
	text  string          // FUNCTION LOAD's argument
	names [fnCount]string // each function's, tg<v>_<name>
}

// lib is the library of this build; tests give stores others
// (NewVersion: buildLibrary with a salt), which they may delete without
// disturbing the rest.
var lib = buildLibrary("")

// versionMark stands for the version while the text is hashed.
const versionMark = "@VERSION@"

// buildLibrary joins the embedded files into the library: a header (the
// values every function shares), the shared files, the functions' files,
// and the registrations. A salt, written in the header, makes another
// version of the same code (tests).
func buildLibrary(salt string) *library {
	var b strings.Builder
	b.WriteString("#!lua name=" + libraryPrefix + versionMark + "\n")
	if salt != "" {
		b.WriteString("-- " + salt + "\n")
	}
	b.WriteString(`--[[ Tollgate's Redis Function library, joined by internal/redisfn
(library.go) from the files of lua/ (lua/embed.go), each after a line
naming it. Its functions are registered at the end, named for the
library's version.
]]

-- KEYS and ARGV are the keys and arguments of the call running, set at its
-- entry (Redis runs one function at a time), so that the functions read
-- them as a script reads its own.
local KEYS, ARGV

-- FN holds each function of the library by name, as its file defines it.
local FN = {}

-- entry is the callback Redis calls for f.
local function entry(f)
  return function(keys, args)
    KEYS, ARGV = keys, args
    return f()
  end
end
`)
	files := slices.Clone(sharedFiles)
	for _, f := range functions {
		if !slices.Contains(files, f.file) {
			files = append(files, f.file)
		}
	}
	for _, name := range files {
		b.WriteString("\n-- ==== lua/" + name + " ====\n")
		b.WriteString(mustRead(name))
	}
	b.WriteString("\n-- ==== the functions of the library ====\n")
	for _, f := range functions {
		flags := ""
		if f.readOnly {
			flags = ", flags = {'no-writes'}"
		}
		fmt.Fprintf(&b, "redis.register_function{function_name = 'tg%s_%s', callback = entry(FN.%s)%s}\n",
			versionMark, f.name, f.name, flags)
	}
	text := b.String()
	sum := sha256.Sum256([]byte(text))
	v := hex.EncodeToString(sum[:])[:12]
	l := &library{name: libraryPrefix + v, text: strings.ReplaceAll(text, versionMark, v)}
	for i, f := range functions {
		l.names[i] = "tg" + v + "_" + f.name
	}
	return l
}

// mustRead reads an embedded file; a missing one is a build mistake, not a
// run-time condition.
func mustRead(name string) string {
	b, err := fs.ReadFile(lua.FS, name)
	if err != nil {
		panic("redisfn: " + err.Error())
	}
	return string(b)
}

// functionMissing reports whether err is Redis's answer to an FCALL of a
// function it does not have: a restarted or flushed Redis, or a new master
// (a reshard, a failover to a replica that did not have it).
func functionMissing(err error) bool {
	return redis.HasErrorPrefix(err, "Function not found")
}

// load loads the library on every master of c, also those it does not
// know serve slots (loadListed) (FUNCTION LOAD; a library of the same
// name is this one: its name is its text's hash).
func (l *library) load(ctx context.Context, c redis.UniversalClient) error {
	load := func(ctx context.Context, n *redis.Client) error {
		err := n.FunctionLoad(ctx, l.text).Err()
		if err != nil && !redis.HasErrorPrefix(err, "Library '"+l.name+"' already exists") {
			return err
		}
		return nil
	}
	if err := ForEachMaster(ctx, c, load); err != nil {
		return fmt.Errorf("redisfn: load the Redis Function library %s (Redis 7.0 or later): %w", l.name, err)
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		loadListed(ctx, cc, load)
	}
	return nil
}

// loadListed runs load on every master that CLUSTER NODES lists, which
// ForEachMaster may not reach: it knows masters by their slots, as its
// last look at the cluster saw them, and a master added to the cluster is
// called before it serves any slot (ASK, while it imports its first), or
// before the node that answered that look knew of its slots. It does its
// best: a master it cannot reach is called again by the next call that
// finds no function there.
func loadListed(ctx context.Context, cc *redis.ClusterClient, load func(context.Context, *redis.Client) error) {
	nodes, err := cc.ClusterNodes(ctx).Result()
	if err != nil {
		return
	}
	o := cc.Options()
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		if len(f) < 8 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := redis.NewClient(&redis.Options{Addr: addr, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
			Dialer: o.Dialer, Protocol: o.Protocol, DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout})
		_ = load(ctx, n)
		_ = n.Close()
	}
}

// ForEachMaster runs f on every master of c (concurrently in a cluster),
// or on c's one server.
func ForEachMaster(ctx context.Context, c redis.UniversalClient, f func(context.Context, *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, f)
	case *redis.Client:
		return f(ctx, c)
	}
	return fmt.Errorf("unsupported client %T", c)
}

// Sending a call once. go-redis sends a command again after errors that
// leave it unknown whether Redis ran it (a read timeout, a connection lost
// once the command was written) and, in a Redis Cluster, sends the whole
// part of a pipeline that went to one master again when Redis answers the
// part's first command TRYAGAIN, CLUSTERDOWN, LOADING or READONLY, though
// it ran the others: an admission run twice counts twice. So the library's
// calls are marked never to be sent again by go-redis (NoRetry), and are
// sent again here only on the answers that say Redis ran nothing
// (resendable): a function not found, a slot moved or moving (MOVED, ASK,
// TRYAGAIN while a slot's keys are split between two masters), a cluster
// down or a replica answering while a failover settles, a connection never
// made.

// onceCmd is an FCALL that go-redis never sends twice.
type onceCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to send the command again on its own.
func (onceCmd) NoRetry() bool { return true }

// fcallCmd returns the command FCALL name with keys and args, as
// Cmdable.FCall builds it, unsent.
func fcallCmd(ctx context.Context, name string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "fcall", name, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}

// MayHaveRun reports whether a call that failed with err may have run in
// Redis all the same: it was sent, and neither an answer nor a refusal
// came back (a timeout, a connection lost after the write). An answer of
// Redis's (an error reply), a call never sent (no connection to be had)
// and Tollgate's own refusal of bad input did not run it.
func MayHaveRun(err error) bool {
	var qe *quota.Error
	var re redis.Error
	switch {
	case errors.As(err, &qe), errors.As(err, &re), resendable(err),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return false
	}
	return true
}

// resendable reports whether err is an answer of Redis saying that it did
// not run the command, which may then be sent again.
func resendable(err error) bool {
	if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
		return true // (never sent)
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false // (a timeout, a lost connection: it may have run)
	}
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN ", "CLUSTERDOWN ", "READONLY ", "LOADING ", "MASTERDOWN "} {
		if strings.HasPrefix(re.Error(), p) {
			return true
		}
	}
	return functionMissing(err)
}

const (
	// resendRounds bounds how many times a call is sent again.
	resendRounds = 12
	// resendPause is the first pause before a call is sent again for
	// anything but a missing function; it doubles each round up to
	// resendPauseMax (about 2 s in all: a slot's migration, a failover).
	resendPause    = 5 * time.Millisecond
	resendPauseMax = 250 * time.Millisecond
)

// call runs the function f (FCALL), sent again while Redis answers that it
// ran nothing (resend).
func (l *library) call(ctx context.Context, c redis.UniversalClient, f Fn, keys []string, args ...any) *redis.Cmd {
	cmd := fcallCmd(ctx, l.names[f], keys, args)
	_ = c.Process(ctx, onceCmd{cmd})
	cmds := []*redis.Cmd{cmd}
	l.resend(ctx, c, cmds)
	return cmds[0]
}

// send sends cmds (FCALLs made by fcallCmd) as one pipeline, each never
// sent twice by go-redis, then sends again those Redis ran nothing of
// (resend), putting their new commands in their places.
func (l *library) send(ctx context.Context, c redis.UniversalClient, cmds []*redis.Cmd) {
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, cmd := range cmds {
			_ = p.Process(ctx, onceCmd{cmd})
		}
		return nil
	})
	l.resend(ctx, c, cmds)
}

// resend sends again the FCALLs of cmds that Redis answered without
// running them (resendable), as one more pipeline each round (a lone call
// as itself), until none is left, resendRounds pass or ctx ends: the
// library loaded first when a master did not have it (restarted, flushed,
// or new: a reshard, a failover to a replica that did not have it), a
// pause first for the rest (a slot migrating, a failover settling). A call
// Redis did not run counts nothing: sending it again counts nothing twice.
func (l *library) resend(ctx context.Context, c redis.UniversalClient, cmds []*redis.Cmd) {
	pause := resendPause
	for round := range resendRounds {
		var again []int
		missing, wait := false, false
		for i, cmd := range cmds {
			if err := cmd.Err(); resendable(err) {
				again = append(again, i)
				if functionMissing(err) {
					missing = true
				} else {
					wait = true
				}
			}
		}
		if len(again) == 0 {
			return
		}
		if missing {
			if err := l.load(ctx, c); err != nil {
				for _, i := range again {
					cmds[i].SetErr(err)
				}
				return
			}
		}
		if wait || round > 0 {
			if cc, ok := c.(*redis.ClusterClient); ok {
				cc.ReloadState(ctx)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, resendPauseMax)
		}
		for _, i := range again {
			args := cmds[i].Args()
			cmds[i] = redis.NewCmd(ctx, args...)
			if n, _ := args[2].(int); n > 0 {
				cmds[i].SetFirstKeyPos(3) // (FCALL name numkeys key...)
			}
		}
		if len(again) == 1 {
			_ = c.Process(ctx, onceCmd{cmds[again[0]]})
			continue
		}
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				_ = p.Process(ctx, onceCmd{cmds[i]})
			}
			return nil
		})
	}
}

// Pipelined sends n calls of the library as one pipeline, call i that of
// the function, keys and arguments each returns for it, and returns their
// commands (sent again while Redis ran nothing of them: library.send) and
// the first error among them.
func (r *Store) Pipelined(ctx context.Context, n int, each func(i int) (f Fn, keys []string, args []any)) ([]*redis.Cmd, error) {
	if n == 0 {
		return nil, nil
	}
	cmds := make([]*redis.Cmd, n)
	for i := range n {
		f, keys, args := each(i)
		cmds[i] = fcallCmd(ctx, r.lib.names[f], keys, args)
	}
	r.lib.send(ctx, r.c, cmds)
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}

// Call runs the library's function f with keys and args (FCALL), sent
// again while Redis answers that it ran nothing: library.call.
func (r *Store) Call(ctx context.Context, f Fn, keys []string, args ...any) *redis.Cmd {
	return r.lib.call(ctx, r.c, f, keys, args...)
}

// Command returns the FCALL of f with keys and args, unsent, for Send.
func (r *Store) Command(ctx context.Context, f Fn, keys []string, args []any) *redis.Cmd {
	return fcallCmd(ctx, r.lib.names[f], keys, args)
}

// Send sends cmds (made by Command) as one pipeline, each never sent twice
// by go-redis, then sends again those Redis ran nothing of, putting their
// new commands in their places: library.send.
func (r *Store) Send(ctx context.Context, cmds []*redis.Cmd) {
	r.lib.send(ctx, r.c, cmds)
}

// ErrNoFunctions is LoadFunctions's error for a Redis that has no
// Functions (older than 7.0), on which Tollgate cannot run.
var ErrNoFunctions = errors.New("redisfn: Redis has no Functions: Tollgate needs Redis 7.0 or later")

// LoadFunctions loads the Function library on every master of the
// store's Redis, as the API and the worker do when they start, and logs
// (log may be nil) the other versions' libraries it finds there
// (tollgate_<v>, left by a rolling upgrade): FUNCTION DELETE removes each
// once no node of its version runs. It fails, with ErrNoFunctions, only on
// a Redis older than 7.0; any other failure (a master that does not
// answer) is logged, and the calls load the library when they find it
// missing, as they do after a restart.
func (r *Store) LoadFunctions(ctx context.Context, log *slog.Logger) error {
	err := r.lib.load(ctx, r.c)
	var others []string
	if err == nil {
		others, err = r.OtherLibraries(ctx)
	}
	switch {
	case redis.HasErrorPrefix(err, "unknown command"):
		return fmt.Errorf("%w (%w)", ErrNoFunctions, err)
	case err != nil && log != nil:
		log.Warn("the Redis Function library is not loaded everywhere yet: calls load it where it is missing", "err", err)
	case len(others) > 0 && log != nil:
		log.Info("Redis holds the Function libraries of other versions: FUNCTION DELETE each once no node of its version runs",
			"libraries", others, "library", r.lib.name)
	}
	return nil
}

// OtherLibraries returns the names of the libraries of other releases than
// this one (tollgate_<v>) on the masters of the store's Redis.
func (r *Store) OtherLibraries(ctx context.Context) ([]string, error) {
	var (
		mu     sync.Mutex
		others []string
	)
	list := func(ctx context.Context, n *redis.Client) error {
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryPrefix + "*"}).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, l := range libs {
			if l.Name != r.lib.name && strings.HasPrefix(l.Name, libraryPrefix) && !slices.Contains(others, l.Name) {
				others = append(others, l.Name)
			}
		}
		return nil
	}
	if err := ForEachMaster(ctx, r.c, list); err != nil {
		return nil, fmt.Errorf("redisfn: list the Redis Function libraries: %w", err)
	}
	slices.Sort(others)
	return others, nil
}

// FunctionLibrary is the name of the store's Function library.
func (r *Store) FunctionLibrary() string { return r.lib.name }
