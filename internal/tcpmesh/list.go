package tcpmesh

// linked is an element of a fifo: it carries its own next pointer, so that
// queueing an element allocates nothing. T is a pointer type (*Req, *msg)
// whose zero value, nil, ends the list.
type linked[T any] interface {
	comparable
	// link is the address of the element's next pointer.
	link() *T
}

// fifo is an intrusive singly linked queue of posted receives (*Req) or of
// unexpected messages (*msg). It is kept by value in the matching maps, so
// a tag's queue costs no allocation of its own.
type fifo[T linked[T]] struct{ head, tail T }

// empty reports whether the queue holds nothing.
func (l *fifo[T]) empty() bool {
	var zero T
	return l.head == zero
}

// push appends e at the tail.
func (l *fifo[T]) push(e T) {
	var zero T
	*e.link() = zero
	if l.tail == zero {
		l.head, l.tail = e, e
		return
	}
	*l.tail.link() = e
	l.tail = e
}

// pop removes and returns the head, or the zero T when the queue is empty.
func (l *fifo[T]) pop() T {
	var zero T
	if l == nil || l.head == zero {
		return zero
	}
	e := l.head
	l.head = *e.link()
	if l.head == zero {
		l.tail = zero
	}
	*e.link() = zero
	return e
}

// remove unlinks e wherever it stands; an e not in the queue is ignored.
func (l *fifo[T]) remove(e T) {
	var zero, prev T
	for c := l.head; c != zero; prev, c = c, *c.link() {
		if c != e {
			continue
		}
		if prev == zero {
			l.head = *c.link()
		} else {
			*prev.link() = *c.link()
		}
		if l.tail == c {
			l.tail = prev
		}
		*c.link() = zero
		return
	}
}

// popFrom, pushTo and removeFrom edit the queue of one key in a map of
// queues, deleting it when it empties so that the maps do not grow with
// every op's tag.
func popFrom[K comparable, T linked[T]](mp map[K]fifo[T], k K) T {
	l, ok := mp[k]
	if !ok {
		var zero T
		return zero
	}
	e := l.pop()
	if l.empty() {
		delete(mp, k)
	} else {
		mp[k] = l
	}
	return e
}

func pushTo[K comparable, T linked[T]](mp map[K]fifo[T], k K, e T) {
	l := mp[k]
	l.push(e)
	mp[k] = l
}

func removeFrom[K comparable, T linked[T]](mp map[K]fifo[T], k K, e T) {
	l := mp[k]
	l.remove(e)
	if l.empty() {
		delete(mp, k)
	} else {
		mp[k] = l
	}
}

func (r *Req) link() **Req  { return &r.next }
func (mg *msg) link() **msg { return &mg.next }
