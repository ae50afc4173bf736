package wharf_test

import (
	"context"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/pgembed"
	"github.com/wharfhq/wharf/internal/testpki"
	"github.com/wharfhq/wharf/wharfmigrate"
)

// PostgreSQL with a private CA's certificate: a client with
// sslmode=verify-full and that CA migrates, enqueues and relays over TLS (the
// server confirms every connection is encrypted); the system's roots or
// another CA are refused.
func TestRelayOverTLSWithVerifyFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "wharf-pki-*")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	pki, err := testpki.New(filepath.Join(dir, "pki"))
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	if os.Geteuid() == 0 {
		// PostgreSQL runs as the postgres user and must own its key.
		u, err := user.Lookup("postgres")
		require.NoError(t, err)
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, pki.Chown(uid, gid))
	}
	cluster, err := pgembed.Start(ctx, pgembed.Options{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": pki.ServerCert, "ssl_key_file": pki.ServerKey, "ssl_ca_file": pki.CA,
	}})
	require.NoError(t, err)
	defer func() { _ = cluster.Stop() }()

	withCA := func(ca string) string {
		u, err := url.Parse(cluster.URL())
		require.NoError(t, err)
		u.Host = "localhost:" + u.Port()
		q := u.Query()
		q.Set("sslmode", "verify-full")
		if ca != "" {
			q.Set("sslrootcert", ca)
		} else {
			q.Del("sslrootcert")
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	pool, err := pgxpool.New(ctx, withCA(pki.CA))
	require.NoError(t, err)
	defer pool.Close()
	m, err := wharfmigrate.New("wharf")
	require.NoError(t, err)
	_, err = m.Up(ctx, pool)
	require.NoError(t, err)

	rec := &recorder{}
	cfg := testConfig("wharf")
	cfg.Handler = rec.handle
	client, err := wharf.NewClient(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	defer func() { _ = client.Stop(ctx) }()
	var ids []string
	for i := range 10 {
		got, err := client.Enqueue(ctx, wharf.Message{Topic: "t", Key: strconv.Itoa(i % 3), Payload: []byte(`{}`)})
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	waitDelivered(t, rec, ids...)
	var plain int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
		WHERE a.backend_type = 'client backend' AND NOT s.ssl`).Scan(&plain))
	require.Zero(t, plain, "every client connection is encrypted")

	for name, ca := range map[string]string{"other CA": pki.OtherCA, "system roots": ""} {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		p, err := pgxpool.New(ctx, withCA(ca))
		if err == nil {
			err = p.Ping(ctx)
			p.Close()
		}
		cancel()
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "certificate", name)
	}
}
