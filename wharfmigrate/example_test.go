package wharfmigrate_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wharfhq/wharf/wharfmigrate"
)

// Create or upgrade the outbox schema from the application, at start-up
// (what `wharf migrate up` does): Up applies the pending migrations, each
// in its own transaction, and is safe to run from several processes at once.
func ExampleMigrator_Up() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	m, err := wharfmigrate.New("example_shop_outbox")
	if err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA example_shop_outbox CASCADE") //nolint:errcheck
	if _, err := m.Up(ctx, pool); err != nil {
		panic(err)
	}
	again, err := m.Up(ctx, pool)
	if err != nil {
		panic(err)
	}
	v, err := m.Version(ctx, pool)
	if err != nil {
		panic(err)
	}
	fmt.Println("at the latest version:", v == m.Latest(), "applied again:", len(again))
	// Output:
	// at the latest version: true applied again: 0
}
