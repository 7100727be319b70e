// bench/custom-plugins.sh: the same work as bench-lookup (Lua) with Kong's Go PDK: read a
// header, look its value up (a map, filled once), set an upstream header.
package main

import (
	"sync"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server"
)

type Config struct {
	Header string
}

var cache sync.Map

func New() interface{} {
	return &Config{Header: "x-key"}
}

func (conf Config) Access(kong *pdk.PDK) {
	header := conf.Header
	if header == "" {
		header = "x-key"
	}
	key, _ := kong.Request.GetHeader(header)
	v, ok := cache.Load(key)
	if !ok {
		v = "v-" + key
		cache.Store(key, v)
	}
	kong.ServiceRequest.SetHeader("x-up", v.(string))
}

func main() {
	server.StartServer(New, "1.0.0", 1000)
}
