package lab

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKernelPanic: a console whose kernel panicked is told by its
// "Kernel panic - not syncing" line; one that did not, or no console,
// is not.
func TestKernelPanic(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	panicked := write("panicked.log", "[  124.60] RIP: 0010:__list_del_entry_valid.cold+0xf/0x6f\n[  124.65] Kernel panic - not syncing: Fatal exception in interrupt\r\n[  124.67] Kernel Offset: 0x16e00000\n")
	if line, ok := kernelPanic(panicked); !ok || line != "Kernel panic - not syncing: Fatal exception in interrupt" {
		t.Errorf("panicked console: %q, %t", line, ok)
	}
	fine := write("fine.log", "kvnet guest: echo on :7, http on :80\nWARNING: something about a panic notifier\n")
	if line, ok := kernelPanic(fine); ok {
		t.Errorf("console without a panic: %q", line)
	}
	if _, ok := kernelPanic(filepath.Join(dir, "missing.log")); ok {
		t.Error("missing console: panicked")
	}
}
