// A plugin written with Kong's Go PDK (github.com/Kong/go-pdk, from the module proxy), run as
// Kong runs one: the embedded plugin server, asked for its info with -dump and started with
// -kong-prefix <dir>, listening on <dir>/go-greeter.socket. Written for Turnpike's tests.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/Kong/go-pdk"
	"github.com/Kong/go-pdk/server"
)

type Config struct {
	Message string
	LogFile string `json:"log_file"`
	Times   int
}

func New() interface{} {
	return &Config{}
}

func (conf Config) Access(kong *pdk.PDK) {
	if deny, _ := kong.Request.GetHeader("x-deny"); deny != "" {
		kong.Response.Exit(402, []byte(`{"message":"denied by go-greeter"}`),
			map[string][]string{"content-type": {"application/json"}, "x-go": {"denied"}})
		return
	}
	host, _ := kong.Request.GetHeader("host")
	times := conf.Times
	if times < 1 {
		times = 1
	}
	greeting := strings.Repeat(conf.Message+" ", times)
	kong.ServiceRequest.SetHeader("x-go-greeting", strings.TrimSpace(greeting)+" "+host)
	headers, _ := kong.Request.GetHeaders(100)
	kong.ServiceRequest.SetHeader("x-go-multi", strings.Join(headers["x-multi"], ","))
	port, _ := kong.Request.GetPort()
	kong.ServiceRequest.SetHeader("x-go-port", fmt.Sprint(port))
	method, _ := kong.Request.GetMethod()
	kong.Response.SetHeader("x-go-method", method)
	kong.Ctx.SetShared("greeted", "yes")
	v, _ := kong.Ctx.GetSharedString("greeted")
	kong.ServiceRequest.SetHeader("x-go-shared", v)
}

func (conf Config) Log(kong *pdk.PDK) {
	if conf.LogFile == "" {
		return
	}
	entry, _ := kong.Log.Serialize()
	status, _ := kong.Response.GetStatus()
	f, err := os.OpenFile(conf.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%d %s\n", status, entry)
}

func main() {
	server.StartServer(New, "0.3.0", 1000)
}
