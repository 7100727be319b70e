// The gRPC upstream of bench/grpc.sh's streaming calls: grpc-go (a production gRPC server)
// serving bench.Echo (../bench.proto) with messages kept as raw bytes (a codec that passes
// them through, so no generated code): Unary answers the request's bytes, Stream echoes each
// message as it comes.
//
// Usage: upstream PORT
package main

import (
	"io"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

type raw struct{}

func (raw) Marshal(v any) ([]byte, error)      { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = append([]byte(nil), data...); return nil }
func (raw) Name() string                       { return "proto" }

func unary(_ any, stream grpc.ServerStream) error {
	var m []byte
	if err := stream.RecvMsg(&m); err != nil {
		return err
	}
	return stream.SendMsg(&m)
}

func echo(_ any, stream grpc.ServerStream) error {
	for {
		var m []byte
		if err := stream.RecvMsg(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := stream.SendMsg(&m); err != nil {
			return err
		}
	}
}

func main() {
	encoding.RegisterCodec(raw{})
	l, err := net.Listen("tcp", "127.0.0.1:"+os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(grpc.ForceServerCodec(raw{}))
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.Echo",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{
			{StreamName: "Unary", Handler: unary, ServerStreams: true, ClientStreams: true},
			{StreamName: "Stream", Handler: echo, ServerStreams: true, ClientStreams: true},
		},
	}, struct{}{})
	log.Fatal(s.Serve(l))
}
