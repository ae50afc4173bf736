// Package pgembed runs a throwaway PostgreSQL cluster from the locally
// installed server binaries, so `wharf demo` and the tests work without anyone
// having to provide a database URL.
package pgembed

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	logTailLines  = 20
	startAttempts = 3
	// readyTimeout bounds the wait for a first connection when the caller's
	// context has no deadline, so a wedged server cannot hang Start forever.
	readyTimeout = 60 * time.Second
	// waitDelay stops a grandchild that inherited pg_ctl's output pipe from
	// blocking cmd.Wait (and leaking its copy goroutine).
	waitDelay = 5 * time.Second
)

const notFoundMsg = "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin: " +
	"install them (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install postgresql@16) " +
	"or give a database URL with --database-url / WHARF_DATABASE_URL"

// Options tunes a throwaway cluster; the zero value is a usable, durable one.
type Options struct {
	// Fsync keeps fsync on (durable, honest numbers for demos). Tests turn it
	// off for speed.
	Fsync bool
	// Logger receives progress lines; nil discards them, because a library
	// should not write to stderr uninvited.
	Logger *slog.Logger
	// Settings are extra `-c name=value` server settings, e.g.
	// {"max_connections":"200"}; they win over the defaults but not over the
	// address, port and socket settings the Cluster depends on.
	Settings map[string]string
}

// Cluster is a running private PostgreSQL server that owns its temp dir, so
// Stop can leave the machine as it was found.
type Cluster struct {
	binDir, dir, dataDir, logFile string
	port                          int
	cred                          *syscall.Credential // non-nil when we must drop root
	log                           *slog.Logger

	opts      Options
	socketDir string

	stopOnce sync.Once
	stopErr  error
}

// FindBinaries returns the directory holding initdb and pg_ctl: first from
// PATH, else the highest-version /usr/lib/postgresql/*/bin (Debian keeps the
// server binaries off PATH), else /usr/local/pgsql/bin (source installs).
func FindBinaries() (string, error) {
	return findBinaries(os.Getenv("PATH"), "/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin")
}

func findBinaries(pathEnv, globPattern, fallback string) (string, error) {
	var candidates []string
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir != "" { // an empty entry means ".", which is never a real install
			candidates = append(candidates, dir)
		}
	}
	matches, _ := filepath.Glob(globPattern) // only ErrBadPattern, which is our bug
	slices.SortStableFunc(matches, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	candidates = append(candidates, matches...)
	candidates = append(candidates, fallback)
	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "pg_ctl")) {
			// Absolute, because the tools run with the temp dir as working dir.
			return filepath.Abs(dir)
		}
	}
	return "", errors.New(notFoundMsg)
}

// HasLibrary reports whether the server in binDir (FindBinaries) has the
// shared library name (e.g. "pg_stat_statements") in its package library
// directory, so that a cluster may load it with shared_preload_libraries:
// from pg_config --pkglibdir when binDir has pg_config, else ../lib beside
// binDir (the Debian and source layouts). A binDir of symbolic links (such
// as /usr/local/bin -> /usr/lib/postgresql/15/bin) is followed through
// initdb's link.
func HasLibrary(binDir, name string) bool {
	if real, err := filepath.EvalSymlinks(filepath.Join(binDir, "initdb")); err == nil {
		binDir = filepath.Dir(real)
	}
	libDir := filepath.Join(filepath.Dir(binDir), "lib")
	if out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--pkglibdir").Output(); err == nil {
		libDir = strings.TrimSpace(string(out))
	}
	for _, ext := range []string{".so", ".dylib", ".dll"} {
		if fi, err := os.Stat(filepath.Join(libDir, name+ext)); err == nil && fi.Mode().IsRegular() {
			return true
		}
	}
	return false
}

// compareVersions orders dotted versions numerically so 16 beats 9; a
// non-numeric part sorts below any number.
func compareVersions(a, b string) int {
	num := func(s string) int {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
		return -1
	}
	return slices.CompareFunc(strings.Split(a, "."), strings.Split(b, "."), func(x, y string) int {
		return cmp.Or(cmp.Compare(num(x), num(y)), strings.Compare(x, y))
	})
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Start initialises and starts a cluster; ctx bounds the startup. On failure
// nothing is left behind and the error carries the tail of the server log,
// since that is where PostgreSQL explains itself.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	log := cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "wharf-pg-*")
	if err != nil {
		return nil, fmt.Errorf("create temp dir for PostgreSQL: %w", err)
	}
	c := &Cluster{
		binDir: binDir, dir: dir, cred: cred, log: log, opts: opts,
		dataDir: filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "server.log"),
	}
	defer func() {
		if err != nil {
			if cerr := c.shutdown(); cerr != nil {
				log.Warn("cleanup after failed PostgreSQL start", "err", cerr)
			}
		}
	}()
	socketDir := filepath.Join(dir, "socket")
	c.socketDir = socketDir
	if err := os.Mkdir(socketDir, 0o700); err != nil {
		return nil, fmt.Errorf("create PostgreSQL socket dir: %w", err)
	}
	if cred != nil {
		if err := chownTree(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("hand temp dir %s to the postgres user: %w", dir, err)
		}
	}

	log.Info("initialising PostgreSQL cluster", "dir", dir, "bin", binDir)
	// --locale=C: the caller's locale may not match UTF8 (initdb then refuses),
	// and C collation keeps ordering identical on every machine.
	args := []string{"-D", c.dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-instructions"}
	if !opts.Fsync {
		args = append(args, "--no-sync")
	}
	if err := c.run(ctx, "initdb", args...); err != nil {
		err = fmt.Errorf("initialise PostgreSQL cluster: %w", err)
		if cred != nil && strings.Contains(err.Error(), "ermission denied") {
			err = fmt.Errorf("%w (initdb ran as OS user postgres, which must be able to reach %s)", err, dir)
		}
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		clash, err := c.startServer(ctx, opts, socketDir)
		if err == nil {
			break
		}
		if !clash || attempt == startAttempts {
			return nil, err
		}
		log.Info("PostgreSQL port taken meanwhile, retrying", "port", c.port, "attempt", attempt)
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("PostgreSQL on port %d does not accept connections: %w%s", c.port, err, c.logTail(0))
	}
	log.Info("PostgreSQL started", "url", c.URL())
	return c, nil
}

// serverCredential returns who to run initdb and the server as: nil (ourselves)
// unless we are root, which initdb and postgres refuse to run as.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root but cannot find an OS user named postgres to run PostgreSQL as (PostgreSQL refuses to run as root): create a user named postgres or run as a non-root user (%w)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("OS user postgres has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free TCP port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startServer runs pg_ctl start and reports whether a failure was a port
// clash, the one failure worth retrying with another port.
func (c *Cluster) startServer(ctx context.Context, opts Options, socketDir string) (clash bool, err error) {
	// wal_level=logical: an outbox in WAL mode streams from a logical
	// replication slot. autovacuum_naptime=5s: a busy table outbox is
	// vacuumed every few seconds over a few seconds of delivered rows,
	// rather than once a minute over a minute of them (the README's advice).
	settings := map[string]string{"max_connections": "200", "wal_level": "logical", "autovacuum_naptime": "5s"}
	if !opts.Fsync {
		settings["fsync"], settings["synchronous_commit"], settings["full_page_writes"] = "off", "off", "off"
	}
	maps.Copy(settings, opts.Settings)
	var o []string
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		o = append(o, "-c", shellQuote(name+"="+settings[name]))
	}
	// Last, so Settings cannot move the server where URL does not point.
	o = append(o, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(c.port),
		"-c", shellQuote("unix_socket_directories="+socketDir))

	var logSize int64 // this attempt's lines start here
	if fi, err := os.Stat(c.logFile); err == nil {
		logSize = fi.Size()
	}
	err = c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60", "start", "-o", strings.Join(o, " "))
	if err == nil {
		return false, nil
	}
	if b, rerr := os.ReadFile(c.logFile); rerr == nil && int64(len(b)) >= logSize {
		clash = bytes.Contains(b[logSize:], []byte("Address already in use"))
	}
	return clash, fmt.Errorf("start PostgreSQL on port %d: %w%s", c.port, err, c.logTail(logSize))
}

// shellQuote is needed because pg_ctl hands -o to /bin/sh, and temp dirs or
// setting values may contain spaces.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// run runs one of the server tools as the server's OS user and folds its
// output into the error, on one line.
func (c *Cluster) run(ctx context.Context, tool string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, tool), args...)
	cmd.Dir = c.dir // the inherited cwd may be unreadable by the postgres user
	cmd.WaitDelay = waitDelay
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: %w", ctx.Err(), err) // "signal: killed" alone hides why
	}
	if err != nil {
		return fmt.Errorf("%s: %w: %s", tool, err, oneLine(out.String()))
	}
	return nil
}

func oneLine(s string) string {
	var lines []string
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, " | ")
}

// logTail returns the last lines of the server log written after offset,
// ready to append to an error.
func (c *Cluster) logTail(offset int64) string {
	b, err := os.ReadFile(c.logFile)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b[offset:])), "\n")
	if tail := oneLine(strings.Join(lines[max(0, len(lines)-logTailLines):], "\n")); tail != "" {
		return "; server log: " + tail
	}
	return ""
}

// waitReady insists on a real connection: pg_ctl -w only reads
// postmaster.pid, which says nothing about TCP reachability or auth.
func (c *Cluster) waitReady(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, readyTimeout)
		defer cancel()
	}
	for {
		err := ping(ctx, c.URL())
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ping(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// URL is a pgx connection string, e.g.
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable; TCP rather than
// the socket so it works for any client on the machine.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// StopServer stops the server with pg_ctl's shutdown mode ("fast" or
// "immediate", a crash) and keeps the data directory.
func (c *Cluster) StopServer(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.run(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "30", "stop", "-m", mode)
}

// StartServer starts a stopped server again on the same port.
func (c *Cluster) StartServer(ctx context.Context) error {
	if _, err := c.startServer(ctx, c.opts, c.socketDir); err != nil {
		return err
	}
	return c.waitReady(ctx)
}

// SaveData stops the server, copies its data directory aside and starts it
// again: RestoreData later puts the server back in exactly this state, as a
// point-in-time restore or a failover to a lagging standby would.
func (c *Cluster) SaveData(ctx context.Context) error {
	if err := c.StopServer("fast"); err != nil {
		return err
	}
	saved := filepath.Join(c.dir, "saved")
	_ = os.RemoveAll(saved)
	if out, err := exec.CommandContext(ctx, "cp", "-a", c.dataDir, saved).CombinedOutput(); err != nil {
		return fmt.Errorf("copy data directory: %w: %s", err, out)
	}
	return c.StartServer(ctx)
}

// RestoreData crashes the server, replaces its data directory with the one
// SaveData copied and starts it on the same port.
func (c *Cluster) RestoreData(ctx context.Context) error {
	if err := c.putBack(ctx); err != nil {
		return err
	}
	return c.StartServer(ctx)
}

// RecoverData is RestoreData that starts the copy in archive recovery,
// which replays the copy's WAL and ends there: the server comes back on a
// new timeline, as after a point-in-time recovery or the promotion of a
// standby.
func (c *Cluster) RecoverData(ctx context.Context) error {
	if err := c.putBack(ctx); err != nil {
		return err
	}
	signal := filepath.Join(c.dataDir, "recovery.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return err
	}
	if c.cred != nil {
		if err := os.Lchown(signal, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return err
		}
	}
	// No archive: recovery reads pg_wal only, and ends at its end.
	opts := c.opts
	opts.Settings = maps.Clone(c.opts.Settings)
	if opts.Settings == nil {
		opts.Settings = map[string]string{}
	}
	opts.Settings["restore_command"] = "false"
	if _, err := c.startServer(ctx, opts, c.socketDir); err != nil {
		return err
	}
	return c.waitReady(ctx)
}

// putBack crashes the server and replaces its data directory with the one
// SaveData copied.
func (c *Cluster) putBack(ctx context.Context) error {
	if err := c.StopServer("immediate"); err != nil {
		return err
	}
	if err := os.RemoveAll(c.dataDir); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", filepath.Join(c.dir, "saved"), c.dataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("restore data directory: %w: %s", err, out)
	}
	return nil
}

// Stop stops the server (pg_ctl stop -m fast, falling back to immediate) and
// removes the data directory. Safe to call twice, so callers can both defer it
// and call it on a signal; later calls return the first call's result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.shutdown()
		if c.stopErr == nil {
			c.log.Info("PostgreSQL stopped and removed", "dir", c.dir)
		}
	})
	return c.stopErr
}

func (c *Cluster) shutdown() error {
	stopErr := c.stopServer()
	var rmErr error
	// Backends orphaned by a dead postmaster may still be writing for a moment.
	for range 5 {
		if rmErr = os.RemoveAll(c.dir); rmErr == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if stopErr != nil && rmErr != nil {
		return fmt.Errorf("%w; remove %s: %w", stopErr, c.dir, rmErr) // errors.Join would span lines
	}
	return cmp.Or(stopErr, rmErr)
}

func (c *Cluster) stopServer() error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); errors.Is(err, fs.ErrNotExist) {
		return nil // never started, or already stopped cleanly
	}
	// Not the caller's context: Stop runs on the way out, often after cancel.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fastErr := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "30", "stop", "-m", "fast")
	if fastErr == nil {
		return nil
	}
	c.log.Warn("fast stop of PostgreSQL failed, trying immediate", "err", fastErr)
	immErr := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "30", "stop", "-m", "immediate")
	if immErr == nil {
		return nil
	}
	// A server that died leaves a stale postmaster.pid that makes stop fail;
	// pg_ctl status exits 3 when no server is running, which is what we want.
	var exitErr *exec.ExitError
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "status"); errors.As(err, &exitErr) && exitErr.ExitCode() == 3 {
		return nil
	}
	return fmt.Errorf("stop PostgreSQL: %w; then: %w", fastErr, immErr)
}
