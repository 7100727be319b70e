module go-lookup

go 1.21

require github.com/Kong/go-pdk v0.11.2

require (
	github.com/ugorji/go/codec v1.2.14 // indirect
	google.golang.org/protobuf v1.36.2 // indirect
)
