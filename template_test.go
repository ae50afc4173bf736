package wharf_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
)

func TestTopicTemplate(t *testing.T) {
	for tmpl, want := range map[string]string{
		"":                     "orders.paid",
		"{{topic}}":            "orders.paid",
		"prod.{{topic}}":       "prod.orders.paid",
		"{{topic}}-v1":         "orders.paid-v1",
		"a.{{topic}}.b":        "a.orders.paid.b",
		"everything-goes-here": "everything-goes-here",
	} {
		tt, err := wharf.ParseTopicTemplate(tmpl)
		require.NoError(t, err, tmpl)
		require.Equal(t, want, tt.Expand("orders.paid"), tmpl)
	}
	tt, err := wharf.ParseTopicTemplate("wharf.{{topic}}")
	require.NoError(t, err)
	require.Equal(t, "wharf.", tt.Prefix())
	_, err = wharf.ParseTopicTemplate("{{topic}}.{{topic}}")
	require.ErrorContains(t, err, "more than once")
}
