package wharfmigrate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// releasedRendered is the SHA-256 of the SQL 0.1.0 runs for the schema
// "wharf": each released migration after load() filled {{schema}} and
// {{channel}} in, and the objects SetWALMode creates, which are schema too
// but live in Go, not in migrations/, and what Migrator.SQL prints of them.
var releasedRendered = map[string]string{
	"001 down":                  "6693dfadc9757f04c1b035ff97c3e64d1e4cc34c984aa012dea4e5a053a6a286",
	"001 up":                    "285331ae26be6df67cd254dd017d8fc683f4700d8d872155ec0be3da860b2601",
	"002 down":                  "1fdb23dec3e897dcad5805968f64c51cf813efdb7a66ac7f790dbcf271579852",
	"002 up":                    "24d777a036b9f80721f52e1b985637d4e1d0fff0981a22a74be251fb8b3086f2",
	"003 down":                  "9837b10496c007a1eb7001089345197aeb96c6f0f9ed79cf7d007d471451c582",
	"003 up":                    "b83926bfe472f32469b665a450ffcfe19aff83479139056894b853afde561996",
	"004 down":                  "0785d0c449892a352ca854e41857901e959ea5000f1907dc7afb38847472a55e",
	"004 up":                    "6c0b1e1631116d5988cefb0c343a7625542dee006ece7843fef87f1230e3aba0",
	"005 down":                  "751b5156d8d31168deeadf37edd5d5825261cf1369eb978c0041d4f70311b12f",
	"005 up":                    "6c86dba28731c65700cd2ef787b18d6cb416229cc94838a3b83444331756f34d",
	"006 down":                  "f69d8fa94f256a0f1ad690e35f39b09b8df78ca3419054cb99fd97231450938d",
	"006 up":                    "81917c8b8b2beed4309d1ccfaf92e41f2926e20d6b92b8db72eb83c1a52ef8e1",
	"007 down":                  "82817d5dc557eb9da8d08f1db1d8ccc3475fa3210100db2dd394a8b7ad45e19f",
	"007 up":                    "1cab8f7627bb504a3ea370a5a260a1990de03e75248d09c6ce7f3ea3dd6c8f0c",
	"008 down":                  "0ac9a4dd3547c7cf40f1722f0b1e1e6cfc9049cf91fede96daa424fe2af679e3",
	"008 up":                    "ccfae350b408f9e37f4cbb0aeb69dd5e1ac2e5d2ff643685b33ad6f2352804d2",
	"009 down":                  "75ea35d8ca8371f3e0631e3cf382932deaadfaf79f621a7748122c7a95df989d",
	"009 up":                    "b2d410be9bcb80922cb1c1e8ff348d130125b9dae68d8b85f8a2fdb39ebbaed7",
	"printed SQL down from 009": "7edc2a13283619b5206f0b12e84e49f5484cfe74f7a5e3591d535ac200dba287",
	"printed SQL up to 009":     "1c220ee968c20b38525cf02b42d67956ad314a308215b0d08b5bac8fbab1cdd1",
	"notify channel":            "4491e9651730e51af0a702cefe500f2e21252fe8346024e66a539cdd00103d9c",
	"wal mode: bring up to date (progress, refuse_rows, enqueue_wal)": "87866f3429fabaf9e48c2beec77bb12f73a7788be99167cc28820b39e8e4f5c8",
	"wal mode: switch (walModeSQL)":                                   "b388c19e294dd1c2de96735c8afe649d56bf21eff05d5829c8733336c4c0bff5",
}

func renderedSums(t *testing.T) map[string]string {
	t.Helper()
	m, err := New("wharf")
	if err != nil {
		t.Fatal(err)
	}
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	got := map[string]string{}
	for _, mg := range m.Migrations() {
		got[fmt.Sprintf("%03d up", mg.Version)] = sum(mg.Up)
		got[fmt.Sprintf("%03d down", mg.Version)] = sum(mg.Down)
	}
	got["wal mode: switch (walModeSQL)"] = sum(m.walModeSQL())
	got["wal mode: bring up to date (progress, refuse_rows, enqueue_wal)"] = sum(strings.ReplaceAll(progressTableSQL+refuseRowsSQL, "{{schema}}", m.schema) + m.enqueueWAL())
	got["notify channel"] = sum(NotifyChannel("wharf"))
	// What `wharf migrate print` gives teams that apply migrations with their
	// own tool, version table included: its released part.
	up, down := m.SQL(true), m.SQL(false)
	if i := strings.Index(up, "\n-- 010_"); i >= 0 {
		up = up[:i]
	}
	if i := strings.Index(down, "\n-- 009_"); i >= 0 {
		down = down[i:]
	}
	got["printed SQL up to 009"] = sum(up)
	got["printed SQL down from 009"] = sum(down)
	return got
}

// TestReleasedSQLRendersTheSame: released.sha256 freezes the files, but
// what a database gets is the files after load() replaced {{schema}} and
// {{channel}} (NotifyChannel), plus the WAL mode's objects, written in
// mode.go from internal/walmsg.ContentSQL. Changing any of these changes
// the schema of new databases and not of the ones 0.1.0 migrated, while
// both record the same version.
func TestReleasedSQLRendersTheSame(t *testing.T) {
	got := renderedSums(t)
	if len(releasedRendered) < 2*9 {
		t.Fatalf("releasedRendered lists %d pieces of SQL; 0.1.0 released 9 migrations, up and down", len(releasedRendered))
	}
	for what, want := range releasedRendered {
		g, ok := got[what]
		switch {
		case !ok:
			t.Errorf("%s was released and is gone", what)
		case g != want:
			t.Errorf("the SQL of %s, as released in 0.1.0 for schema wharf, has changed (sha256 %s, released as %s): migration files, load()'s placeholders, NotifyChannel, Migrator.SQL, mode.go and internal/walmsg.ContentSQL make it; restore it and put the change in a new migration (for WAL mode: also bring existing WAL outboxes up to date in SetWALModeReport)", what, g, want)
		}
	}
}
