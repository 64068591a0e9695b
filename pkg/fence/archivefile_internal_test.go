package fence

import (
	"reflect"
	"strings"
	"testing"
)

// The columns the row decoder takes by exact name are archiveLine's.
func TestArchiveColumnsAreArchiveLinesNames(t *testing.T) {
	typ := reflect.TypeFor[archiveLine]()
	want := map[string]bool{}
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		want[name] = true
	}
	if !reflect.DeepEqual(want, archiveColumns) {
		t.Fatalf("archiveColumns %v, archiveLine's names %v", archiveColumns, want)
	}
}
