// Package tap creates, adopts and deletes tenant taps the way CNI ADD and
// DEL do: a persistent multiqueue tap named from its identity, stamped with
// its owner in the alias, enslaved to its VPC's VRF, up, with the
// attachment's routes in the VRF's table.
//
// The rules a caller must know: an existing tap is adopted, never recreated,
// because a VMM may hold it; a tap another owner stamped is refused; Delete
// treats a tap that is gone as deleted. Callers hold the VPC's VRF lock
// (node/vrf) around Create and Delete, as the reclaim does.
package tap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/jsimonetti/rtnetlink/v2/driver"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	linkdriver "github.com/datum-cloud/galactic-node/node/link/driver"
	"github.com/datum-cloud/galactic-node/node/tun"
)

// Sentinel errors callers branch on.
var (
	// ErrOwnedByAnother: the tap carries another owner's stamp.
	ErrOwnedByAnother = errors.New("tap is stamped by another owner")
	// ErrNotATap: a link of the tap's name exists and is not a tap.
	ErrNotATap = errors.New("link exists and is not a tap")
	// ErrMasterMismatch: the VRF name is taken by a link of another kind.
	ErrMasterMismatch = errors.New("vrf name is taken by a link of another kind")
)

// MasterKind says what device a VPC's taps are enslaved to.
type MasterKind int

const (
	// MasterVRF is a real VRF device: what production nodes use.
	MasterVRF MasterKind = iota
	// MasterBridge is a bridge standing in for the VRF, for kernels built
	// without CONFIG_NET_VRF (test machines, the demo). It enslaves and
	// scopes taps the same way as far as this project is concerned, but
	// does not bind the table to the device.
	MasterBridge
)

func (k MasterKind) String() string {
	if k == MasterBridge {
		return "bridge"
	}
	return "vrf"
}

// Config describes one tenant tap.
type Config struct {
	Identity identity.Identity
	// Owner is the stamp written to the tap's alias: the sandbox or container
	// ID. It is required, since an unstamped tap can never be reclaimed.
	Owner string
	// Replaces is the stamp of a tap this Create may take over and
	// restamp: the caller found it unheld under the VRF lock. Empty: a tap
	// another owner stamped is refused.
	Replaces    string
	SingleQueue bool    // default multiqueue, whose queue counts show holders
	UID, GID    *uint32 // optional tun owner and group, for unprivileged VMMs
	MTU         uint32  // 0 keeps the kernel's default
	Master      MasterKind
	Table       uint32         // the VRF's routing table
	Routes      []netip.Prefix // the attachment's routes, through the tap
}

func (c Config) validate() error {
	var errs []error
	if !c.Identity.Valid() {
		errs = append(errs, fmt.Errorf("identity %v: %w", c.Identity, identity.ErrMalformed))
	}
	if c.Owner == "" {
		errs = append(errs, errors.New("owner stamp is empty"))
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		errs = append(errs, fmt.Errorf("mtu %d outside 68..65535", c.MTU))
	}
	if c.Table == 0 || c.Table == unix.RT_TABLE_MAIN || c.Table == unix.RT_TABLE_LOCAL {
		errs = append(errs, fmt.Errorf("table %d is not a VRF table", c.Table))
	}
	for _, r := range c.Routes {
		if !r.IsValid() {
			errs = append(errs, fmt.Errorf("route %v is not a prefix", r))
		}
	}
	return errors.Join(errs...)
}

// Manager changes taps in one network namespace.
type Manager struct {
	ns   *os.File // nil: the caller's namespace
	conn *link.Conn
	log  *slog.Logger
}

// NewManager returns a Manager for the namespace ns (nil for the caller's),
// using conn, which must be dialled into the same namespace.
func NewManager(ns *os.File, conn *link.Conn, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{ns: ns, conn: conn, log: log}
}

// Result is what Create did.
type Result struct {
	Tap     link.Tap
	Adopted bool // the tap existed and was adopted, not created
}

// Create creates the tap cfg describes, or adopts an existing tap of that
// name, and brings it into service: stamped, enslaved to its VRF (created if
// missing), MTU set, up, routes in the VRF's table. A failure after this call
// created the tap deletes it again; a tap it adopted is never deleted.
func (m *Manager) Create(ctx context.Context, cfg Config) (Result, error) {
	name := cfg.Identity.TapName()
	if err := cfg.validate(); err != nil {
		return Result{}, fmt.Errorf("create tap %s: %w", name, err)
	}
	master, err := m.EnsureMaster(ctx, cfg.Identity.VPC, cfg.Master, cfg.Table)
	if err != nil {
		return Result{}, fmt.Errorf("create tap %s: %w", name, err)
	}
	l, adopted, err := m.openOrAdopt(ctx, cfg)
	if err != nil {
		return Result{}, fmt.Errorf("create tap %s: %w", name, err)
	}
	if err := m.configure(ctx, cfg, l, master.Index); err != nil {
		if !adopted {
			if derr := m.conn.DeleteVerified(ctx, link.Expect{Index: l.Index, Name: l.Name, Alias: cfg.Owner}); derr != nil && !errors.Is(derr, link.ErrLinkGone) {
				err = errors.Join(err, fmt.Errorf("undo: %w", derr))
			}
		}
		return Result{}, fmt.Errorf("create tap %s: %w", name, err)
	}
	l, err = m.conn.Get(ctx, l.Index)
	if err != nil {
		return Result{}, fmt.Errorf("create tap %s: read back: %w", name, err)
	}
	tap, _ := l.AsTap()
	m.log.Info("tap ready", "tap", name, "ifindex", l.Index, "owner", cfg.Owner, "adopted", adopted,
		"master", master.Name, "master_kind", cfg.Master.String(), "routes", len(cfg.Routes))
	return Result{Tap: tap, Adopted: adopted}, nil
}

// openOrAdopt returns the existing tap of cfg's name if its stamp allows, or
// creates it persistent with no queue held.
func (m *Manager) openOrAdopt(ctx context.Context, cfg Config) (l link.Link, adopted bool, err error) {
	name := cfg.Identity.TapName()
	l, err = m.conn.GetByName(ctx, name)
	switch {
	case err == nil:
		adopted = true
	case errors.Is(err, link.ErrLinkGone):
		if err := m.createPersistent(ctx, cfg); err != nil {
			return link.Link{}, false, err
		}
		if l, err = m.conn.GetByName(ctx, name); err != nil {
			return link.Link{}, false, fmt.Errorf("read new tap: %w", err)
		}
	default:
		return link.Link{}, false, err
	}
	if _, ok := l.AsTap(); !ok {
		return link.Link{}, false, fmt.Errorf("%s is kind %q: %w", name, l.Kind, ErrNotATap)
	}
	if l.Alias != "" && l.Alias != cfg.Owner && (cfg.Replaces == "" || l.Alias != cfg.Replaces) {
		// Also reached when another writer created the tap between the
		// lookup and TUNSETIFF, which then attached to it instead of
		// creating; it is theirs, so it is not undone.
		return link.Link{}, false, fmt.Errorf("%s stamped %q, not %q: %w", name, l.Alias, cfg.Owner, ErrOwnedByAnother)
	}
	return l, adopted, nil
}

// createPersistent creates the tap stamped with its owner, and only then
// makes it persistent: until TUNSETPERSIST the tap lives only as long as
// this file, so a plugin killed before it leaves no tap, and one killed
// after leaves a tap stamped by its container, which that container's DEL
// retry, GC and the reclaim all recognise. An unstamped persistent tap is
// one nothing would ever remove.
func (m *Manager) createPersistent(ctx context.Context, cfg Config) error {
	f, err := tun.Open(m.ns, cfg.Identity.TapName(), tun.Mode{SingleQueue: cfg.SingleQueue})
	if err != nil {
		return err
	}
	defer f.Close() // the tap persists; no queue stays held
	if cfg.UID != nil {
		if err := tun.SetOwner(f, *cfg.UID); err != nil {
			return err
		}
	}
	if cfg.GID != nil {
		if err := tun.SetGroup(f, *cfg.GID); err != nil {
			return err
		}
	}
	name := cfg.Identity.TapName()
	l, err := m.conn.GetByName(ctx, name)
	if err != nil {
		return fmt.Errorf("read new tap: %w", err)
	}
	// Another writer's tap, created between the lookup and TUNSETIFF, is
	// left as it is: openOrAdopt refuses it by its stamp.
	if l.Alias == "" {
		if err := m.conn.Set(ctx, l.Index, link.Change{Alias: &cfg.Owner}); err != nil {
			return fmt.Errorf("stamp new tap: %w", err)
		}
		// Before its first up: see link.SetNoQueue for the kernel
		// memory this saves.
		if err := m.conn.SetNoQueue(ctx, l.Index); err != nil {
			return err
		}
	}
	return tun.SetPersist(f, true)
}

func (m *Manager) configure(ctx context.Context, cfg Config, l link.Link, master uint32) error {
	up := true
	if err := m.conn.Set(ctx, l.Index, link.Change{Alias: &cfg.Owner, Master: &master, MTU: cfg.MTU, Up: &up}); err != nil {
		return err
	}
	for _, dst := range cfg.Routes {
		if err := m.conn.ReplaceRoute(ctx, link.Route{Dst: dst, Table: cfg.Table, Link: l.Index}); err != nil {
			return err
		}
	}
	return nil
}

// EnsureMaster returns the VPC's VRF device, creating it (or the bridge that
// stands in for it) if missing and bringing it up. A link of that name of
// another kind is ErrMasterMismatch.
func (m *Manager) EnsureMaster(ctx context.Context, vpc identity.VPC, kind MasterKind, table uint32) (link.Link, error) {
	name := vpc.VRFName()
	l, err := m.conn.GetByName(ctx, name)
	if errors.Is(err, link.ErrLinkGone) {
		req := &rtnetlink.LinkMessage{Family: unix.AF_UNSPEC, Attributes: &rtnetlink.LinkAttributes{Name: name}}
		switch kind {
		case MasterVRF:
			req.Attributes.Info = &rtnetlink.LinkInfo{Kind: "vrf", Data: &linkdriver.VRF{Table: table}}
		case MasterBridge:
			req.Attributes.Info = &rtnetlink.LinkInfo{Kind: "bridge", Data: &driver.Bridge{}}
		}
		if err := m.conn.Create(ctx, req); err != nil && !errors.Is(err, unix.EEXIST) {
			return link.Link{}, fmt.Errorf("ensure vrf %s: %w", name, err)
		}
		if kind == MasterBridge {
			m.log.Info("created a bridge standing in for a VRF: this kernel path has no VRF support", "vrf", name, "table", table)
		} else {
			m.log.Info("created VRF", "vrf", name, "table", table)
		}
		l, err = m.conn.GetByName(ctx, name)
	}
	if err != nil {
		return link.Link{}, fmt.Errorf("ensure vrf %s: %w", name, err)
	}
	if l.Kind != kind.String() {
		return link.Link{}, fmt.Errorf("ensure vrf %s: want kind %s, found %q: %w", name, kind, l.Kind, ErrMasterMismatch)
	}
	if !l.AdminUp {
		up := true
		if err := m.conn.Set(ctx, l.Index, link.Change{Up: &up}); err != nil {
			return link.Link{}, fmt.Errorf("ensure vrf %s: %w", name, err)
		}
	}
	return l, nil
}

// Delete deletes the tap of id if owner stamped it (an empty owner deletes
// whatever the stamp). A tap that is gone counts as deleted, so Delete can be
// repeated. The kernel removes the tap's routes with it.
func (m *Manager) Delete(ctx context.Context, id identity.Identity, owner string) error {
	name := id.TapName()
	l, err := m.conn.GetByName(ctx, name)
	if errors.Is(err, link.ErrLinkGone) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete tap %s: %w", name, err)
	}
	if _, ok := l.AsTap(); !ok {
		return fmt.Errorf("delete tap %s: kind %q: %w", name, l.Kind, ErrNotATap)
	}
	if owner != "" && l.Alias != owner {
		return fmt.Errorf("delete tap %s: stamped %q, not %q: %w", name, l.Alias, owner, ErrOwnedByAnother)
	}
	err = m.conn.DeleteVerified(ctx, link.Expect{Index: l.Index, Name: l.Name, Alias: l.Alias})
	if err != nil && !errors.Is(err, link.ErrLinkGone) {
		return fmt.Errorf("delete tap %s: %w", name, err)
	}
	m.log.Info("tap deleted", "tap", name, "ifindex", l.Index, "owner", l.Alias)
	return nil
}
