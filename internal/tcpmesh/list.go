package tcpmesh

type reqList struct{ head, tail *Req }

// popReq, pushReq, removeReq and popMsg edit the FIFO of one key, deleting
// it when it empties so that the maps do not grow with every op's tag.
func popReq[K comparable](mp map[K]reqList, k K) *Req {
	l, ok := mp[k]
	if !ok {
		return nil
	}
	r := l.pop()
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
	return r
}

func pushReq[K comparable](mp map[K]reqList, k K, r *Req) {
	l := mp[k]
	l.push(r)
	mp[k] = l
}

func removeReq[K comparable](mp map[K]reqList, k K, r *Req) {
	l := mp[k]
	l.remove(r)
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
}

func popMsg(mp map[key]msgList, k key) *msg {
	l, ok := mp[k]
	if !ok {
		return nil
	}
	mg := l.pop()
	if l.head == nil {
		delete(mp, k)
	} else {
		mp[k] = l
	}
	return mg
}

func (l *reqList) push(r *Req) {
	r.next = nil
	if l.tail == nil {
		l.head, l.tail = r, r
		return
	}
	l.tail.next = r
	l.tail = r
}

func (l *reqList) pop() *Req {
	if l == nil || l.head == nil {
		return nil
	}
	r := l.head
	l.head = r.next
	if l.head == nil {
		l.tail = nil
	}
	r.next = nil
	return r
}

func (l *reqList) remove(r *Req) {
	var prev *Req
	for c := l.head; c != nil; prev, c = c, c.next {
		if c == r {
			if prev == nil {
				l.head = c.next
			} else {
				prev.next = c.next
			}
			if l.tail == c {
				l.tail = prev
			}
			c.next = nil
			return
		}
	}
}

type msgList struct{ head, tail *msg }

func (l *msgList) push(mg *msg) {
	mg.next = nil
	if l.tail == nil {
		l.head, l.tail = mg, mg
		return
	}
	l.tail.next = mg
	l.tail = mg
}

func (l *msgList) pop() *msg {
	if l == nil || l.head == nil {
		return nil
	}
	mg := l.head
	l.head = mg.next
	if l.head == nil {
		l.tail = nil
	}
	mg.next = nil
	return mg
}
