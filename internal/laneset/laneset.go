// Package laneset writes sets of lane numbers the way the relay's logs and
// the CLI show them.
package laneset

import (
	"fmt"
	"slices"
	"strings"
)

// Ranges writes lanes as sorted ranges: "0-9,12,20-31". It sorts a copy;
// lanes is left as it was.
func Ranges(lanes []int) string {
	lanes = slices.Sorted(slices.Values(lanes))
	var b strings.Builder
	for i := 0; i < len(lanes); {
		j := i
		for j+1 < len(lanes) && lanes[j+1] == lanes[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", lanes[i], lanes[j])
		} else {
			fmt.Fprintf(&b, "%d", lanes[i])
		}
		i = j + 1
	}
	return b.String()
}
