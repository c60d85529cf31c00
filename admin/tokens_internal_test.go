package admin

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// A token file rewritten in place (truncate, then write, as echo > file
// and os.WriteFile do) is empty for an instant. A look that falls there
// must not revoke the tokens, also when the content written next is
// refused: what the file said before stays in force.
func TestATruncateThenWriteRewriteRevokesNothing(t *testing.T) {
	const token = "admin-0123456789abcdef"
	path := filepath.Join(t.TempDir(), "tokens")
	write := func(content string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("admin " + token + "\n")
	f, err := LoadTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	write("") // the instant between truncate and write
	f.check(log)
	write("superuser " + token + " extra\n") // then a write that is refused
	f.check(log)
	f.check(log)
	if f.Lookup(token) != RoleAdmin {
		t.Fatal("a look at the truncated file revoked the tokens")
	}
	// A change that stays is taken at the next look.
	write("")
	f.check(log)
	f.check(log)
	if f.Lookup(token) != RoleNone {
		t.Fatal("an emptied file kept its tokens")
	}
}
