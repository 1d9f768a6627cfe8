package idemproxy

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"time"

	"go.nanomsg.org/mangos/v3"
	"go.nanomsg.org/mangos/v3/transport"
)

// HandshakeTimeout is how long a new connection waits for the peer's SP
// header before it is closed and dialed again. 10 s is NNG's fixed value (the
// Python and Rust clients cannot change it), so every client but C (nanomsg:
// a fixed 1 s) uses it.
const HandshakeTimeout = 10 * time.Second

// mangos v3 reads the peer's SP header with no time limit, so a peer that
// accepts and never sends it (a wedged idemproxy, the wrong program on the
// endpoint) would hold the dialer forever. ipc:// and tcp:// are therefore
// dialed through these transports, which are mangos' own with a deadline on
// the handshake; Serve rewrites the endpoint's scheme to reach them.
const timedPrefix = "idemproxy+"

type timedTran struct{ network string }

func init() {
	transport.RegisterTransport(timedTran{"unix"})
	transport.RegisterTransport(timedTran{"tcp"})
}

// timedEndpoint is the endpoint to dial: ours for ipc:// and tcp://.
func timedEndpoint(endpoint string) string {
	if strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "tcp://") {
		return timedPrefix + endpoint
	}
	return endpoint
}

func (t timedTran) Scheme() string {
	if t.network == "unix" {
		return timedPrefix + "ipc"
	}
	return timedPrefix + "tcp"
}

func (t timedTran) NewDialer(url string, sock mangos.Socket) (transport.Dialer, error) {
	addr, err := transport.StripScheme(t, url)
	if err != nil {
		return nil, err
	}
	if t.network == "tcp" {
		if _, err := transport.ResolveTCPAddr(addr); err != nil {
			return nil, err
		}
	}
	return &timedDialer{network: t.network, addr: addr, proto: sock.Info()}, nil
}

func (t timedTran) NewListener(string, mangos.Socket) (transport.Listener, error) {
	return nil, mangos.ErrBadTran // a worker only dials
}

type timedDialer struct {
	network, addr string
	proto         transport.ProtocolInfo
	maxRecvSize   int // set before Serve dials, read by the dialing goroutine after
}

func (d *timedDialer) Dial() (transport.Pipe, error) {
	c, err := net.DialTimeout(d.network, d.addr, HandshakeTimeout)
	if err != nil {
		return nil, err
	}
	var p transport.ConnPipe
	if d.network == "unix" {
		p = transport.NewConnPipeIPC(c, d.proto)
	} else {
		_ = c.(*net.TCPConn).SetNoDelay(true)
		_ = c.(*net.TCPConn).SetKeepAlive(true)
		p = transport.NewConnPipe(c, d.proto)
	}
	p.SetOption(mangos.OptionMaxRecvSize, d.maxRecvSize)
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
	hs := transport.NewConnHandshaker()
	defer hs.Close()
	hs.Start(p)
	pipe, err := hs.Wait()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	if d.network == "unix" {
		return &ipcPipe{Pipe: pipe, c: c, maxrx: d.maxRecvSize}, nil
	}
	return pipe, nil
}

// ipcPipe is mangos' ipc pipe with a Recv that refuses a frame whose type
// byte is not 1: nanomsg's ipc frames are type 1 = message, and mangos takes
// any type as one. Such a frame closes the connection (the dialer then dials
// again), as a message over the receive limit does.
type ipcPipe struct {
	transport.Pipe          // Send, Close, GetOption: mangos' own
	c              net.Conn // read only by Recv, which mangos calls from one goroutine
	maxrx          int      // the receive limit; 0: none
}

func (p *ipcPipe) Recv() (*transport.Message, error) {
	var head [9]byte // type, 64-bit big-endian length
	if _, err := io.ReadFull(p.c, head[:]); err != nil {
		return nil, err
	}
	if head[0] != 1 {
		return nil, fmt.Errorf("idemproxy: ipc frame of type %d is not a message", head[0])
	}
	n := binary.BigEndian.Uint64(head[1:])
	if n > math.MaxInt || (p.maxrx > 0 && n > uint64(p.maxrx)) {
		return nil, mangos.ErrTooLong
	}
	msg := mangos.NewMessage(int(n))
	msg.Body = msg.Body[:n]
	if _, err := io.ReadFull(p.c, msg.Body); err != nil {
		msg.Free()
		return nil, err
	}
	return msg, nil
}

func (d *timedDialer) SetOption(name string, v interface{}) error {
	if name != mangos.OptionMaxRecvSize {
		return mangos.ErrBadOption
	}
	n, ok := v.(int)
	if !ok {
		return mangos.ErrBadValue
	}
	d.maxRecvSize = n
	return nil
}

func (d *timedDialer) GetOption(name string) (interface{}, error) {
	if name != mangos.OptionMaxRecvSize {
		return nil, mangos.ErrBadOption
	}
	return d.maxRecvSize, nil
}
