package link

import (
	"net"

	"github.com/jsimonetti/rtnetlink/v2"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link/driver"
)

// Link is what this project reads of one network link.
type Link struct {
	Index      uint32
	Name       string
	Alias      string // IFLA_IFALIAS, the kernel's name for it; a tenant tap's owner stamp (Tap.Owner)
	Kind       string // IFLA_INFO_KIND, e.g. "tun", "bridge", "vrf"
	SlaveKind  string // IFLA_INFO_SLAVE_KIND: the kind of the master, as the slave sees it
	Master     uint32 // ifindex of the master, 0 if none
	MasterKind string // Kind of the master link, when it was in the same dump
	Group      uint32 // IFLA_GROUP
	MTU        uint32
	Address    net.HardwareAddr
	AdminUp    bool  // IFF_UP: says nothing about who holds a tap
	Carrier    *bool // IFLA_CARRIER; nil when the kernel did not report it
	Tun        *driver.Tun
}

func fromMessage(m *rtnetlink.LinkMessage) Link {
	l := Link{Index: m.Index, AdminUp: m.Flags&unix.IFF_UP != 0}
	a := m.Attributes
	if a == nil {
		return l
	}
	l.Name = a.Name
	l.MTU = a.MTU
	l.Address = a.Address
	if a.Alias != nil {
		l.Alias = *a.Alias
	}
	if a.Master != nil {
		l.Master = *a.Master
	}
	if a.NetDevGroup != nil {
		l.Group = *a.NetDevGroup
	}
	if a.Carrier != nil {
		up := *a.Carrier != 0
		l.Carrier = &up
	}
	if a.Info != nil {
		l.Kind = a.Info.Kind
		l.SlaveKind = a.Info.SlaveKind
		if tun, ok := a.Info.Data.(*driver.Tun); ok {
			l.Tun = tun
		}
	}
	return l
}

// resolveMasters fills MasterKind from the other links of the same dump.
func resolveMasters(links []Link) {
	kinds := make(map[uint32]string, 8)
	for i := range links {
		if links[i].Kind != "" && links[i].Kind != "tun" {
			kinds[links[i].Index] = links[i].Kind
		}
	}
	for i := range links {
		if links[i].Master != 0 {
			links[i].MasterKind = kinds[links[i].Master]
		}
	}
}

// Tap is a link that is a tenant tap: a tun device whose name parses as a
// tenant tap name.
type Tap struct {
	Link
	Identity identity.Identity
}

// AsTap returns l as a tenant tap. A link of kind "tun" whose attributes
// could not be decoded still counts (and reads as held); one that decoded as
// a layer-3 tun does not.
func (l Link) AsTap() (Tap, bool) {
	if l.Kind != "tun" {
		return Tap{}, false
	}
	if l.Tun != nil && l.Tun.Err() == nil && l.Tun.Type != driver.TunTypeTap {
		return Tap{}, false
	}
	id, err := identity.ParseTapName(l.Name)
	if err != nil {
		return Tap{}, false
	}
	return Tap{Link: l, Identity: id}, true
}

// TenantTaps returns the tenant taps among links, in the same order.
func TenantTaps(links []Link) []Tap {
	var taps []Tap
	for _, l := range links {
		if t, ok := l.AsTap(); ok {
			taps = append(taps, t)
		}
	}
	return taps
}

// Owner is the tap's owner stamp: the sandbox or container that made it,
// kept in the link's alias (IFLA_IFALIAS). Above the link layer this is the
// one name for it (TapRef.Owner, tap.Config.Owner, the JSON "owner").
func (t Tap) Owner() string { return t.Alias }

// Stamped reports whether the tap carries an owner stamp. An unstamped tap
// cannot be attributed to a sandbox and must never be removed.
func (t Tap) Stamped() bool { return t.Owner() != "" }
