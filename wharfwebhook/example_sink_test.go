package wharfwebhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/wharfmigrate"
	"github.com/wharfhq/wharf/wharfwebhook"
)

// A relay POSTs each message to an HTTP endpoint, signed as Standard
// Webhooks; the endpoint checks the signature and answers 2xx to
// acknowledge it.
func ExampleNew() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // whsec_ and the base64 of the key
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(r.Header.Get(wharfwebhook.HeaderID) + "." + r.Header.Get(wharfwebhook.HeaderTimestamp) + "." + string(body)))
		signed := r.Header.Get(wharfwebhook.HeaderSignature) == "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil))
		fmt.Println(r.Method, r.URL.Path, r.Header.Get(wharfwebhook.HeaderKey), string(body), "signed:", signed)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()

	sink, err := wharfwebhook.New(wharfwebhook.Options{
		URL:          endpoint.URL + "/hooks/{{topic}}",
		Secret:       secret,
		AllowPrivate: true, // the endpoint is on 127.0.0.1
	})
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := exampleSchema(ctx, pool)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck

	client, err := wharf.NewClient(pool, &wharf.Config{Schema: schema, Sink: sink, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	if _, err := client.Enqueue(ctx, wharf.Message{Topic: "orders", Key: "42", Payload: []byte(`{"order":42}`)}); err != nil {
		panic(err)
	}
	if err := client.Drain(ctx); err != nil {
		panic(err)
	}
	// Output:
	// POST /hooks/orders 42 {"order":42} signed: true
}

// exampleSchema migrates a schema of the example's own.
func exampleSchema(ctx context.Context, pool *pgxpool.Pool) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "wx_" + hex.EncodeToString(b[:])
	m, err := wharfmigrate.New(schema)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx, pool); err != nil {
		panic(err)
	}
	return schema
}
