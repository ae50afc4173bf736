// Package awsurl reads what the URLs of the AWS sinks (sqs://, sns://,
// kinesis://) say alike, the region in the host, static credentials in the
// user part and the endpoint and profile options, and loads the AWS SDK
// configuration they ask for.
package awsurl

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// Common is what an AWS sink URL says that every AWS sink reads the same
// way.
type Common struct {
	Region    string // the host; empty: the default chain's
	Endpoint  string // endpoint=
	Profile   string // profile=
	AccessKey string // the user part, with SecretKey
	SecretKey string
}

// Parse checks u's scheme and shape and reads its host (the region) and
// user part (static credentials). pkg names the package opening it and
// usage says how such a URL is written, for the errors, which name u
// without its password.
func Parse(u *url.URL, scheme, pkg, usage string) (Common, error) {
	shown := u.Redacted()
	var c Common
	if u.Scheme != scheme {
		return c, fmt.Errorf("sink URL %q: %s opens %s:// URLs here", shown, pkg, scheme)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return c, fmt.Errorf("sink URL %q: write %s", shown, usage)
	}
	if u.Port() != "" {
		return c, fmt.Errorf("sink URL %q: the host is the AWS region (e.g. eu-west-1) and has no port; an emulator's address goes in endpoint=http://host:port", shown)
	}
	c.Region = u.Hostname()
	for i := 0; i < len(c.Region); i++ {
		if ch := c.Region[i]; (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '-' {
			return c, fmt.Errorf("sink URL %q: the host %q is not an AWS region name such as eu-west-1", shown, c.Region)
		}
	}
	if u.User != nil {
		c.AccessKey = u.User.Username()
		c.SecretKey, _ = u.User.Password()
		if c.AccessKey == "" || c.SecretKey == "" {
			return c, fmt.Errorf("sink URL %q: credentials in the URL are ACCESS_KEY_ID:SECRET_ACCESS_KEY@; leave them out to use the default AWS credential chain", shown)
		}
	}
	return c, nil
}

// Option reads the options every AWS sink takes, endpoint and profile; ok
// is false for any other key. exampleEndpoint is an emulator's URL for
// the error on a bad endpoint; shown is the URL as errors name it.
func (c *Common) Option(shown, k, v, exampleEndpoint string) (ok bool, err error) {
	switch k {
	case "endpoint":
		e, err := url.Parse(v)
		if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return true, fmt.Errorf("sink URL %q: endpoint=%q is not an http:// or https:// URL such as %s", shown, v, exampleEndpoint)
		}
		c.Endpoint = v
	case "profile":
		if v == "" {
			return true, fmt.Errorf("sink URL %q: profile is empty: name a profile of the shared AWS config, or drop the option", shown)
		}
		c.Profile = v
	default:
		return false, nil
	}
	return true, nil
}

// Load builds the AWS configuration c asks for: the default chain
// (environment, shared config and credentials files, SSO, web identity,
// container and instance roles) with c's region, profile, endpoint and
// credentials on top. The HTTP client is the SDK's default one, whose
// transport the returned handle reaches so that a sink's Close can close
// its idle connections. scheme is the URL's, for the error on a missing
// region.
func (c Common) Load(ctx context.Context, scheme string) (aws.Config, *Transport, error) {
	tr := &Transport{}
	hc := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) { tr.p.Store(t) })
	opts := []func(*config.LoadOptions) error{config.WithHTTPClient(hc)}
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	if c.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(c.Profile))
	}
	if c.AccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(c.AccessKey, c.SecretKey, "")))
	}
	if c.Endpoint != "" {
		opts = append(opts, config.WithBaseEndpoint(c.Endpoint))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return cfg, nil, fmt.Errorf("cannot load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return cfg, nil, fmt.Errorf("no AWS region: put it in the URL's host (e.g. %s://eu-west-1?...) or set AWS_REGION", scheme)
	}
	return cfg, tr, nil
}

// Transport reaches the HTTP transport of a client Load configured, once
// the client built it.
type Transport struct {
	p atomic.Pointer[http.Transport]
}

// CloseIdle closes the transport's idle connections; it does nothing on a
// nil Transport (a sink given its client rather than a URL).
func (t *Transport) CloseIdle() {
	if t == nil {
		return
	}
	if tr := t.p.Load(); tr != nil {
		tr.CloseIdleConnections()
	}
}
