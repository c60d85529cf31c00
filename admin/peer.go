package admin

import (
	"context"
	"net"
	"slices"
	"strconv"
)

// Peer is the process at the other end of an admin socket connection, as
// the kernel vouches for it when the connection is made (SO_PEERCRED and
// SO_PEERGROUPS): no header the caller writes can change it.
type Peer struct {
	UID, GID uint32
	PID      int32
	Groups   []uint32 // supplementary groups
}

// PeerPolicy says what a socket peer may do without a token: uid 0 is
// admin, and members of ReadGroup may read.
type PeerPolicy struct {
	// ReadGroup is the gid whose members may read; nil: no group.
	ReadGroup *uint32
}

// role is what p may do under the policy.
func (pp PeerPolicy) role(p Peer) Role {
	switch {
	case p.UID == 0:
		return RoleAdmin
	case pp.ReadGroup != nil && (p.GID == *pp.ReadGroup || slices.Contains(p.Groups, *pp.ReadGroup)):
		return RoleRead
	}
	return RoleNone
}

func (p Peer) String() string { return "uid:" + strconv.FormatUint(uint64(p.UID), 10) }

type peerKey struct{}

// PeerContext is an http.Server's ConnContext: it records the kernel's
// credentials of a unix-socket peer on the connection's context, once per
// connection. Other connections (TCP) carry none, and only tokens count.
func PeerContext(ctx context.Context, c net.Conn) context.Context {
	p, ok, err := PeerOf(c)
	if err != nil || !ok {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, p)
}

func peerFrom(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerKey{}).(Peer)
	return p, ok
}

// PeerOf reads the credentials of c's peer. ok is false when c is not a
// unix socket (through any wrapper with a NetConn method, as tls.Conn and
// connlimit's connections have), and off Linux, where SO_PEERCRED and
// SO_PEERGROUPS do not exist: there only tokens count.
func PeerOf(c net.Conn) (Peer, bool, error) {
	for {
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = w.NetConn()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, false, nil
	}
	return unixPeer(uc)
}
