module github.com/idemproxy/idemproxy/clients/go

go 1.23

require (
	go.nanomsg.org/mangos/v3 v3.4.2
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/Microsoft/go-winio v0.5.2 // indirect
	github.com/gorilla/websocket v1.5.0 // indirect
	golang.org/x/sys v0.0.0-20210124154548-22da62e12c0c // indirect
)
