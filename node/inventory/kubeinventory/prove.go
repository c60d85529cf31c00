package kubeinventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/datum-cloud/galactic-node/node/inventory"
)

// proofPageSize bounds one page of a consistent read: 20,000 objects are
// read in four requests, and a page's decoded form stays small.
const proofPageSize = 5000

// Prove implements inventory.Prover: it lists every VPCAttachment and
// BGPAdvertisement with a consistent read (no resourceVersion: the API
// server answers at etcd's current revision, never from a stale cache) and
// builds a snapshot of what the API server holds at that moment. Objects are
// decoded only as far as the reclaim needs them. Any failure (403, timeout,
// refused) is an error naming the resource.
func (c *Cluster) Prove(ctx context.Context) (inventory.Snapshot, error) {
	var objects []inventory.Object
	for _, w := range c.sources {
		objs, err := c.list(ctx, w)
		if err != nil {
			return inventory.Snapshot{}, fmt.Errorf("%w: consistent read of %s: %w", inventory.ErrNotProvenCurrent, w.gvr.Resource, err)
		}
		objects = append(objects, objs...)
	}
	c.proven.Store(time.Now().UnixNano())
	return inventory.NewSnapshot(objects, true, nil), nil
}

// ProvenAt implements inventory.Prover.
func (c *Cluster) ProvenAt() time.Time {
	at := c.proven.Load()
	oldest := int64(-1)
	for _, w := range c.sources {
		seen := w.seen.Load()
		if oldest < 0 || seen < oldest {
			oldest = seen
		}
	}
	if oldest > at {
		at = oldest
	}
	if at <= 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}

// proofList is the part of a list response a consistent read decodes.
type proofList struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Status struct {
			VPC           string `json:"vpc"`
			VPCAttachment string `json:"vpcAttachment"`
		} `json:"status"`
	} `json:"items"`
}

func (c *Cluster) list(ctx context.Context, w *watched) ([]inventory.Object, error) {
	var objects []inventory.Object
	cont := ""
	for {
		page, err := c.listPage(ctx, w.gvr, cont)
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			objects = append(objects, w.fromFields(it.Metadata.Namespace, it.Metadata.Name, it.Status.VPC, it.Status.VPCAttachment))
		}
		if cont = page.Metadata.Continue; cont == "" {
			return objects, nil
		}
	}
}

func (c *Cluster) listPage(ctx context.Context, gvr schema.GroupVersionResource, cont string) (*proofList, error) {
	q := url.Values{"limit": {strconv.Itoa(proofPageSize)}}
	if cont != "" {
		q.Set("continue", cont)
	}
	u := fmt.Sprintf("%s/apis/%s/%s/%s?%s", c.host, gvr.Group, gvr.Version, gvr.Resource, q.Encode())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var status metav1.Status
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &status) == nil && status.Message != "" {
			return nil, fmt.Errorf("%s: %s", resp.Status, status.Message)
		}
		return nil, errors.New(resp.Status)
	}
	var page proofList
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, fmt.Errorf("decode list: %w", err)
	}
	return &page, nil
}
