"""The node's hookscript, run for real inside the emulated PVE node (its ``post-start`` phase).

The proxmox_hookscript role installs ``sandbox-rt-hookscript.pl`` into the node's snippets directory,
as on a PVE node. The node has no pve-container, so the node engine gives the script stand-ins for
the four PVE modules it uses, written into the node beside it (``PERL_DIR``); everything else is
real: the script, the node's perl, the nested CT's cgroup files and the node's disk.

* ``PVE::LXC::Config``: the CT's config as a JSON file the engine writes before the run and reads
  back after it (``load_config``/``write_config``; the server keeps the real config);
* ``PVE::LXC``: ``find_lxc_pid`` asks LXC in the node (``lxc-info``), as pve-container's does;
* ``PVE::LXC::CGroup``: ``get_path($controller, 1)``, the CT's *limiting* cgroup. pve-container asks
  LXC's command socket (``LXC_CMD_GET_LIMITING_CGROUP``: ``lxc/<vmid>``, outside the CT's inner
  ``ns``); here it is read from the CT's init in ``/proc/<pid>/cgroup`` (an inner ``ns`` stripped).
  The node's nested CTs use LXC's default layout (``lxc.payload.<vmid>``, no inner cgroup), which
  the hardening site reads too (tests/hardening/sites.py);
* ``PVE::Storage``: ``path`` of a rootfs volume is the CT's writable directory (the overlay's upper
  dir: the emulated storage is a directory on the node's disk).
"""

from __future__ import annotations

__all__ = ["CONF_DIR", "PERL_DIR", "SCRIPT", "SHIMS"]

SCRIPT = "/var/lib/vz/snippets/sandbox-rt-hookscript.pl"  # where the role puts it (inventory)
PERL_DIR = "/usr/local/lib/pve-testserver/perl"  # the stand-in modules, in the node
CONF_DIR = "/var/lib/pve-testserver/hook"  # <vmid>.json: the CT's config for one run, in the node

SHIMS = {
    "PVE/LXC/Config.pm": r"""package PVE::LXC::Config;
# PVE test server stand-in (pve_testserver/node_hook.py): the config is a JSON file of the engine.
use strict; use warnings; use JSON::PP;
sub _file {
    my $vmid = $_[1];
    die "bad vmid\n" if $vmid !~ m/^\d+$/;
    return "/var/lib/pve-testserver/hook/$vmid.json";
}
sub load_config {
    my ($class, $vmid) = @_;
    open(my $fh, '<', $class->_file($vmid))
        or die "Configuration file 'nodes/pve/lxc/$vmid.conf' does not exist\n";
    local $/; my $conf = decode_json(<$fh>); close($fh); return $conf;
}
sub write_config {
    my ($class, $vmid, $conf) = @_;
    my $file = $class->_file($vmid);
    open(my $fh, '>', "$file.tmp") or die "cannot write $file: $!\n";
    print {$fh} JSON::PP->new->canonical->encode($conf);
    close($fh) or die "cannot write $file: $!\n";
    rename("$file.tmp", $file) or die "cannot write $file: $!\n";
}
sub parse_volume {
    my ($class, $key, $text) = @_;
    my ($volume) = split(/,/, $text // '', 2);
    $volume =~ s/^volume=//;
    return { volume => $volume };
}
1;
""",
    "PVE/LXC.pm": r"""package PVE::LXC;
# PVE test server stand-in (pve_testserver/node_hook.py): only what the post-start phase uses.
use strict; use warnings;
sub find_lxc_pid {
    my ($vmid) = @_;
    my $pid = `lxc-info -n $vmid -p -H 2>/dev/null`;
    chomp($pid);
    return $pid =~ m/^\d+$/ ? $pid : undef;
}
sub parse_id_maps { die "PVE::LXC::parse_id_maps is not emulated (the engine writes host keys)\n"; }
sub mount_all { die "PVE::LXC::mount_all is not emulated (the engine writes host keys)\n"; }
sub umount_all { return 1; }
1;
""",
    "PVE/LXC/CGroup.pm": r"""package PVE::LXC::CGroup;
# PVE test server stand-in (pve_testserver/node_hook.py): the CT's limiting cgroup from its init's
# /proc/<pid>/cgroup (pve-container asks LXC's command socket for the same directory).
use strict; use warnings;
use PVE::LXC;
sub new { my ($class, $vmid) = @_; return bless { vmid => $vmid }, $class; }
sub _version { return -e '/sys/fs/cgroup/cgroup.controllers' ? 2 : 1; }
sub get_path {
    my ($self, $controller, $limiting) = @_;
    my $pid = PVE::LXC::find_lxc_pid($self->{vmid}) or return undef;
    my $ver = _version();
    open(my $fh, '<', "/proc/$pid/cgroup") or return undef;
    my @lines = <$fh>;
    close($fh);
    for my $line (@lines) {
        chomp($line);
        my (undef, $controllers, $path) = split(/:/, $line, 3);
        my $match = $ver == 2 ? $controllers eq '' : grep { $_ eq $controller } split(/,/, $controllers);
        next if !$match;
        $path =~ s{/ns$}{} if $limiting;
        return ($ver == 2 ? "/sys/fs/cgroup$path" : "/sys/fs/cgroup/$controllers$path", $ver);
    }
    return undef;
}
sub get_any_path {
    my ($self, $limiting, @controllers) = @_;
    for my $c (@controllers) {
        my ($path, $ver) = $self->get_path($c, $limiting);
        return ($path, $ver) if defined($path) && -d $path;
    }
    return undef;
}
1;
""",
    "PVE/Storage.pm": r"""package PVE::Storage;
# PVE test server stand-in (pve_testserver/node_hook.py): a rootfs volume is the CT's writable dir.
use strict; use warnings;
sub config { return {}; }
sub path {
    my ($cfg, $volid) = @_;
    my ($vmid) = $volid =~ m/(?:^|\/)(?:vm|subvol)-(\d+)-disk-\d+/ or die "unknown volume '$volid'\n";
    open(my $fh, '<', "/var/lib/lxc/$vmid/config") or die "no CT $vmid\n";
    my $rootfs;
    while (my $line = <$fh>) {
        $rootfs = $1 if $line =~ m/^lxc\.rootfs\.path\s*=\s*(\S+)/;
    }
    close($fh);
    die "CT $vmid has no rootfs\n" if !defined($rootfs);
    return $1 if $rootfs =~ m/^overlay(?:fs)?:[^:]+:([^:]+)$/;
    $rootfs =~ s/^dir://;
    return $rootfs;
}
1;
""",
}
