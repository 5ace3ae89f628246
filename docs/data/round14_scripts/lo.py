"""print TcpExt ListenOverflows/ListenDrops and SYN-related counters from /proc/net/netstat"""
lines = open("/proc/net/netstat").read().splitlines()
for a, b in zip(lines[::2], lines[1::2]):
    if a.startswith("TcpExt:"):
        d = dict(zip(a.split()[1:], map(int, b.split()[1:])))
        print({k: d.get(k) for k in ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "TCPTimeouts", "TCPSynRetrans")})
