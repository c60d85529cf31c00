package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// File reads the inventory from a multi-document YAML file of full
// VPCAttachment and BGPAdvertisement objects (apiVersion, kind, metadata,
// spec, status), for labs, the demo and tests without a cluster. The file is
// read again whenever its size, modification time or inode changes. A
// document of another kind, or one that does not parse, makes the snapshot
// unhealthy with an error naming the document, so nothing is removed on a
// file that was half written or mistyped. An object whose identity fields do
// not parse is listed as malformed and blocks only what it could denote, as
// in the cluster. Fields are read as the text
// written, as the API server would keep them.
type File struct {
	path string

	mu      sync.Mutex
	stamp   fileStamp
	objects []Object
	err     error
	snap    *Snapshot // built from objects; rebuilt only when the file changes
}

type fileStamp struct {
	size    int64
	modTime time.Time
	inode   uint64
}

// NewFile returns a File source over path; the file is read on first use.
func NewFile(path string) *File { return &File{path: path} }

// Snapshot implements Source.
func (f *File) Snapshot(context.Context) Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		f.stamp, f.objects, f.err = fileStamp{}, nil, fmt.Errorf("inventory file: %w", err)
		return NewSnapshot(nil, false, f.err)
	}
	stamp := fileStamp{size: fi.Size(), modTime: fi.ModTime(), inode: inodeOf(fi)}
	if stamp != f.stamp || (f.objects == nil && f.err == nil) {
		f.objects, f.err = readFile(f.path)
		f.stamp, f.snap = stamp, nil
	}
	if f.err != nil {
		return NewSnapshot(nil, false, f.err)
	}
	if f.snap == nil {
		s := NewSnapshot(f.objects, true, nil)
		f.snap = &s
	}
	// Snapshots are read-only to their users, so one built per file
	// version serves every pass (65 ms saved per pass at 100,000 objects).
	s := *f.snap
	s.TakenAt = time.Now()
	return s
}

// fileDocument is the part of an object the inventory reads.
type fileDocument struct {
	APIVersion, Kind string
	Metadata         struct{ Name, Namespace string }
	Status           struct{ VPC, VPCAttachment string }
}

// decode reads the fields of one YAML document as the text written. The
// CRDs keep them as strings, whereas YAML 1.1 resolution (sigs.k8s.io/yaml)
// would read vpcAttachment 0012 as the octal 10, another identity than the
// one the cluster carries. An absent, null or empty value is not set.
func (d *fileDocument) decode(raw []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode && !isNull(root) {
		return fmt.Errorf("want a mapping, got %s", describe(root))
	}
	for _, f := range []struct {
		path []string
		dst  *string
	}{
		{[]string{"apiVersion"}, &d.APIVersion},
		{[]string{"kind"}, &d.Kind},
		{[]string{"metadata", "name"}, &d.Metadata.Name},
		{[]string{"metadata", "namespace"}, &d.Metadata.Namespace},
		{[]string{"status", "vpc"}, &d.Status.VPC},
		{[]string{"status", "vpcAttachment"}, &d.Status.VPCAttachment},
	} {
		v, err := textAt(root, f.path)
		if err != nil {
			return err
		}
		*f.dst = v
	}
	return nil
}

// textAt returns the text of the scalar at path, a sequence of mapping keys
// from n, or "" when a value along it is absent or null.
func textAt(n *yaml.Node, path []string) (string, error) {
	for i, key := range path {
		if n = resolve(n); isNull(n) {
			return "", nil
		}
		if n.Kind != yaml.MappingNode {
			return "", fmt.Errorf("%s: want a mapping, got %s", strings.Join(path[:i], "."), describe(n))
		}
		var err error
		if n, err = valueOf(n, key); err != nil || n == nil {
			if err != nil {
				err = fmt.Errorf("%s: %w", strings.Join(path[:i+1], "."), err)
			}
			return "", err
		}
	}
	switch n = resolve(n); {
	case isNull(n):
		return "", nil
	case n.Kind != yaml.ScalarNode:
		return "", fmt.Errorf("%s: want a string, got %s", strings.Join(path, "."), describe(n))
	}
	return n.Value, nil
}

// valueOf returns the value of key in mapping m, or nil if absent. A key
// given twice, or a merge key that could supply it, is an error: which value
// holds is then a matter of YAML library, and the answer decides a removal.
func valueOf(m *yaml.Node, key string) (*yaml.Node, error) {
	var v *yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := resolve(m.Content[i])
		switch {
		case k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge":
			return nil, errors.New("a merge key (<<) may set it, which is not supported")
		case k.Kind != yaml.ScalarNode || k.Value != key:
			continue
		case v != nil:
			return nil, errors.New("key given twice")
		}
		v = m.Content[i+1]
	}
	return v, nil
}

func resolve(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// isNull: an explicit null (~, null) or an empty value, not a quoted "null".
func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.ScalarNode:
		return "a scalar"
	}
	return "an alias"
}

func readFile(path string) ([]Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inventory file: %w", err)
	}
	return ParseObjects(data)
}

// ParseObjects parses a multi-document YAML stream of inventory objects.
func ParseObjects(data []byte) ([]Object, error) {
	r := newDocumentReader(data)
	var objects []Object
	for n := 1; ; n++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objects, nil
		}
		if err != nil {
			return nil, fmt.Errorf("inventory document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		var doc fileDocument
		if err := doc.decode(raw); err != nil {
			return nil, fmt.Errorf("inventory document %d: %w", n, err)
		}
		name := doc.Metadata.Namespace + "/" + doc.Metadata.Name
		if doc.Metadata.Name == "" {
			return nil, fmt.Errorf("inventory document %d (%s): metadata.name is empty", n, doc.Kind)
		}
		switch {
		case doc.Kind == AttachmentKind && doc.APIVersion == AttachmentAPIVersion:
			objects = append(objects, AttachmentObject(doc.Metadata.Namespace, doc.Metadata.Name, doc.Status.VPC, doc.Status.VPCAttachment))
		case doc.Kind == AdvertisementKind && doc.APIVersion == AdvertisementAPIVersion:
			objects = append(objects, AdvertisementObject(doc.Metadata.Namespace, doc.Metadata.Name))
		default:
			return nil, fmt.Errorf("inventory document %d (%s %s %s): want %s %s or %s %s",
				n, doc.APIVersion, doc.Kind, name, AttachmentAPIVersion, AttachmentKind, AdvertisementAPIVersion, AdvertisementKind)
		}
	}
}
