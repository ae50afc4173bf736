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

func TestTopicTemplateDashes(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{{topic|dashes}}":         "orders-paid",
		"wharf-{{topic|dashes}}":   "wharf-orders-paid",
		"a.{{topic|dashes}}.fifo":  "a.orders-paid.fifo",
		"x-{{topic|dashes}}-y-z.b": "x-orders-paid-y-z.b",
	} {
		tt, err := wharf.ParseTopicTemplate(tmpl)
		require.NoError(t, err, tmpl)
		require.Equal(t, want, tt.Expand("orders.paid"), tmpl)
	}
	tt, err := wharf.ParseTopicTemplate("q.{{topic|dashes}}")
	require.NoError(t, err)
	require.Equal(t, "q.", tt.Prefix())
	require.Equal(t, "q.a-b-c", tt.Expand("a.b.c"))
	_, err = wharf.ParseTopicTemplate("{{topic}}-{{topic|dashes}}")
	require.ErrorContains(t, err, "more than once")
}

func TestTopicTemplateUnknownPlaceholder(t *testing.T) {
	for tmpl, want := range map[string]string{
		"wharf-{{topc}}":         `unknown placeholder {{topc}} in template "wharf-{{topc}}": templates take {{topic}} or {{topic|dashes}}`,
		"{{ topic }}":            `unknown placeholder {{ topic }} in template "{{ topic }}"`,
		"{{topic|dots}}":         `unknown placeholder {{topic|dots}}`,
		"{{topic}}.{{key}}":      `unknown placeholder {{key}}`,
		"{{Topic}}":              `unknown placeholder {{Topic}}`,
		"wharf-{{topic":          `unclosed placeholder {{topic in template "wharf-{{topic"`,
		"{{topic}}-{{topic|dash": `unclosed placeholder {{topic|dash`,
	} {
		_, err := wharf.ParseTopicTemplate(tmpl)
		require.Error(t, err, tmpl)
		require.Contains(t, err.Error(), want, tmpl)
		require.NotContains(t, err.Error(), "\n", tmpl)
	}
}
