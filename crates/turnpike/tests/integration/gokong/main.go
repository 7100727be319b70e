// Decodes every entity a Turnpike Admin API returns with Kong's Go client library
// (github.com/kong/go-kong, the library decK and Kong's Kubernetes controller use): every
// list, every entity read back by its id, the root, /status and the plugin schemas. It exits
// non-zero on the first response go-kong cannot decode and prints, per kind, how many
// entities it decoded, so the test can check that it saw what it created.
//
// Usage: gokong-decode http://127.0.0.1:8001
//
//	gokong-decode http://127.0.0.1:8001 expression-routes
//
// The second form writes through go-kong as Kong's Kubernetes controller does on the
// expressions router (a service, routes with `expression` and `priority`, one updated) and
// prints, one JSON object a line, each route as go-kong decodes it when read back (by id, by
// name and in the list), then an attempt it expects the gateway to refuse ("refused": the
// error go-kong returns).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/kong/go-kong/kong"
)

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}

// each lists the entities of one kind and reads every one back by its id.
func each[T any](counts map[string]int, kind string, list func() ([]*T, error), id func(*T) *string, get func(*T) (*T, error)) []*T {
	all, err := list()
	if err != nil {
		fail("list "+kind, err)
	}
	for _, e := range all {
		if _, err := get(e); err != nil {
			fail(fmt.Sprintf("get %s %s", kind, *id(e)), err)
		}
	}
	counts[kind] = len(all)
	return all
}

func main() {
	ctx := context.Background()
	c, err := kong.NewClient(kong.String(os.Args[1]), nil)
	if err != nil {
		fail("client", err)
	}
	if len(os.Args) > 2 && os.Args[2] == "expression-routes" {
		expressionRoutes(ctx, c)
		return
	}
	if _, err := c.Root(ctx); err != nil {
		fail("root", err)
	}
	if _, err := c.Info.Get(ctx); err != nil {
		fail("info", err)
	}
	if _, err := c.Status(ctx); err != nil {
		fail("status", err)
	}
	n := map[string]int{}
	each(n, "services", func() ([]*kong.Service, error) { return c.Services.ListAll(ctx) },
		func(e *kong.Service) *string { return e.ID },
		func(e *kong.Service) (*kong.Service, error) { return c.Services.Get(ctx, e.ID) })
	each(n, "routes", func() ([]*kong.Route, error) { return c.Routes.ListAll(ctx) },
		func(e *kong.Route) *string { return e.ID },
		func(e *kong.Route) (*kong.Route, error) { return c.Routes.Get(ctx, e.ID) })
	each(n, "consumers", func() ([]*kong.Consumer, error) { return c.Consumers.ListAll(ctx) },
		func(e *kong.Consumer) *string { return e.ID },
		func(e *kong.Consumer) (*kong.Consumer, error) { return c.Consumers.Get(ctx, e.ID) })
	ups := each(n, "upstreams", func() ([]*kong.Upstream, error) { return c.Upstreams.ListAll(ctx) },
		func(e *kong.Upstream) *string { return e.ID },
		func(e *kong.Upstream) (*kong.Upstream, error) { return c.Upstreams.Get(ctx, e.ID) })
	for _, u := range ups {
		ts, err := c.Targets.ListAll(ctx, u.ID)
		if err != nil {
			fail("list targets of "+*u.ID, err)
		}
		n["targets"] += len(ts)
		if _, err := c.UpstreamNodeHealth.ListAll(ctx, u.ID); err != nil {
			fail("health of "+*u.ID, err)
		}
	}
	each(n, "certificates", func() ([]*kong.Certificate, error) { return c.Certificates.ListAll(ctx) },
		func(e *kong.Certificate) *string { return e.ID },
		func(e *kong.Certificate) (*kong.Certificate, error) { return c.Certificates.Get(ctx, e.ID) })
	each(n, "snis", func() ([]*kong.SNI, error) { return c.SNIs.ListAll(ctx) },
		func(e *kong.SNI) *string { return e.ID },
		func(e *kong.SNI) (*kong.SNI, error) { return c.SNIs.Get(ctx, e.ID) })
	each(n, "ca_certificates", func() ([]*kong.CACertificate, error) { return c.CACertificates.ListAll(ctx) },
		func(e *kong.CACertificate) *string { return e.ID },
		func(e *kong.CACertificate) (*kong.CACertificate, error) { return c.CACertificates.Get(ctx, e.ID) })
	plugins := each(n, "plugins", func() ([]*kong.Plugin, error) { return c.Plugins.ListAll(ctx) },
		func(e *kong.Plugin) *string { return e.ID },
		func(e *kong.Plugin) (*kong.Plugin, error) { return c.Plugins.Get(ctx, e.ID) })
	for _, p := range plugins {
		if _, err := c.Plugins.GetFullSchema(ctx, p.Name); err != nil {
			fail("schema of "+*p.Name, err)
		}
	}
	each(n, "vaults", func() ([]*kong.Vault, error) { return c.Vaults.ListAll(ctx) },
		func(e *kong.Vault) *string { return e.ID },
		func(e *kong.Vault) (*kong.Vault, error) { return c.Vaults.Get(ctx, e.ID) })
	each(n, "key_sets", func() ([]*kong.KeySet, error) { return c.KeySets.ListAll(ctx) },
		func(e *kong.KeySet) *string { return e.ID },
		func(e *kong.KeySet) (*kong.KeySet, error) { return c.KeySets.Get(ctx, e.ID) })
	each(n, "keys", func() ([]*kong.Key, error) { return c.Keys.ListAll(ctx) },
		func(e *kong.Key) *string { return e.ID },
		func(e *kong.Key) (*kong.Key, error) { return c.Keys.Get(ctx, e.ID) })
	each(n, "keyauth_credentials", func() ([]*kong.KeyAuth, error) { return c.KeyAuths.ListAll(ctx) },
		func(e *kong.KeyAuth) *string { return e.ID },
		func(e *kong.KeyAuth) (*kong.KeyAuth, error) { return c.KeyAuths.Get(ctx, e.Consumer.ID, e.ID) })
	each(n, "basicauth_credentials", func() ([]*kong.BasicAuth, error) { return c.BasicAuths.ListAll(ctx) },
		func(e *kong.BasicAuth) *string { return e.ID },
		func(e *kong.BasicAuth) (*kong.BasicAuth, error) { return c.BasicAuths.Get(ctx, e.Consumer.ID, e.ID) })
	each(n, "hmacauth_credentials", func() ([]*kong.HMACAuth, error) { return c.HMACAuths.ListAll(ctx) },
		func(e *kong.HMACAuth) *string { return e.ID },
		func(e *kong.HMACAuth) (*kong.HMACAuth, error) { return c.HMACAuths.Get(ctx, e.Consumer.ID, e.ID) })
	each(n, "jwt_secrets", func() ([]*kong.JWTAuth, error) { return c.JWTAuths.ListAll(ctx) },
		func(e *kong.JWTAuth) *string { return e.ID },
		func(e *kong.JWTAuth) (*kong.JWTAuth, error) { return c.JWTAuths.Get(ctx, e.Consumer.ID, e.ID) })
	each(n, "acls", func() ([]*kong.ACLGroup, error) { return c.ACLs.ListAll(ctx) },
		func(e *kong.ACLGroup) *string { return e.ID },
		func(e *kong.ACLGroup) (*kong.ACLGroup, error) { return c.ACLs.Get(ctx, e.Consumer.ID, e.ID) })
	each(n, "oauth2_credentials", func() ([]*kong.Oauth2Credential, error) { return c.Oauth2Credentials.ListAll(ctx) },
		func(e *kong.Oauth2Credential) *string { return e.ID },
		func(e *kong.Oauth2Credential) (*kong.Oauth2Credential, error) {
			return c.Oauth2Credentials.Get(ctx, e.Consumer.ID, e.ID)
		})
	out, _ := json.Marshal(n)
	fmt.Println(string(out))
}

// expressionRoutes: see the file's doc.
func expressionRoutes(ctx context.Context, c *kong.Client) {
	svc, err := c.Services.Create(ctx, &kong.Service{Name: kong.String("expr"), URL: kong.String("http://127.0.0.1:9")})
	if err != nil {
		fail("create service", err)
	}
	show := func(r *kong.Route) {
		out, _ := json.Marshal(map[string]any{"name": r.Name, "expression": r.Expression,
			"priority": r.Priority, "protocols": r.Protocols, "paths": r.Paths,
			"service": r.Service.ID, "strip_path": r.StripPath})
		fmt.Println(string(out))
	}
	made := []*kong.Route{}
	for _, r := range []*kong.Route{
		{Name: kong.String("users"), Expression: kong.String(`http.path ^= "/users" && http.method == "GET"`),
			Priority: kong.Uint64(kong.MaxRoutePriority), Service: svc, StripPath: kong.Bool(true)},
		{Name: kong.String("plain"), Expression: kong.String(`http.host == "a.test"`), Service: svc},
	} {
		got, err := c.Routes.Create(ctx, r)
		if err != nil {
			fail("create route "+*r.Name, err)
		}
		made = append(made, got)
	}
	made[1].Expression = kong.String(`http.host == "b.test" || http.host == "c.test"`)
	made[1].Priority = kong.Uint64(7)
	if _, err := c.Routes.Update(ctx, made[1]); err != nil {
		fail("update route plain", err)
	}
	for _, r := range made {
		byID, err := c.Routes.Get(ctx, r.ID)
		if err != nil {
			fail("get route "+*r.Name, err)
		}
		byName, err := c.Routes.Get(ctx, r.Name)
		if err != nil {
			fail("get route by name "+*r.Name, err)
		}
		if *byName.ID != *byID.ID {
			fail("route by name", fmt.Errorf("%s is not %s", *byName.ID, *byID.ID))
		}
		show(byID)
	}
	all, err := c.Routes.ListAll(ctx)
	if err != nil {
		fail("list routes", err)
	}
	for _, r := range all {
		show(r)
	}
	_, err = c.Routes.Create(ctx, &kong.Route{Name: kong.String("bad"),
		Expression: kong.String(`http.path == "/a" &&`), Service: svc})
	out, _ := json.Marshal(map[string]any{"refused": fmt.Sprint(err)})
	fmt.Println(string(out))
}
