#!/usr/bin/perl
# sandbox_rt hookscript for Proxmox VE containers: each sandbox's SSH host key and its resource caps.
#
# Installed by the proxmox_hookscript role as <snippets dir>/sandbox-rt-hookscript.pl and set on the
# sandbox template (root@pam only):  pct set <template vmid> --hookscript local:snippets/sandbox-rt-hookscript.pl
# Linked clones inherit the option, so every sandbox runs it.
#
# pre-start: drop a "sandbox-rt-caps-applied:" line a former start published (it must describe this
# start). If the CT's description has no "sandbox-rt-ssh-host-key:" line (a fresh clone), generate
# one ed25519 host key, write it into the CT's root filesystem as /etc/ssh/ssh_host_ed25519_key{,.pub}
# (owned by the CT's mapped root, 0600/0644), and publish the public half as that line of the
# description. The runtime reads the line after the start task ended OK and pins it before its first
# SSH contact (docs/proxmox.md, tests/pve_server/hostkey.py). A restart keeps key and line.
#
# post-start: the caps PVE's CT config has no option for (the API schema names none). The runtime
# writes what the sandbox asked for as the description line
#     sandbox-rt-caps: pids_max=<n> disk_mbps=<n> disk_iops=<n>
# and the node bounds each value by its own ceiling (/etc/sandbox_rt/pve-hookscript.conf, written by
# the role; a missing line or a 0 asks for the ceiling). The script writes them into the CT's limiting
# cgroup (pve-container's lxc/<vmid>, outside the CT's own "ns" cgroup, so the CT cannot raise them):
# pids.max, and for the block device that holds the CT's rootfs io.max (cgroup v2) or
# blkio.throttle.{read,write}_{bps,iops}_device (v1), reads them back, and publishes what holds as
#     sandbox-rt-caps-applied: pids_max=<n> disk_mbps=<n> disk_iops=<n> device=<major:minor|->
# The runtime compares that line with the request after the start task and refuses a sandbox whose
# caps did not come out as asked (PVE only warns when a post-start hookscript fails, so the line,
# not the exit code, is what proves the caps).
# The node's pids budget: the pids limits of all CTs on the node (their limiting cgroups, siblings
# of this one) may add up to kernel.pid_max less 1/8 (sandbox_rt.caps.pid_budget), so sandboxes
# together cannot exhaust the node's pids. Checked and written under one node-wide lock, so two
# starts cannot both take the last share. A CT that does not fit gets no caps and the line
#     sandbox-rt-caps-refused: pids budget: ...
# which the runtime reports (it then destroys the CT).
#
# The start task holds the CT's config lock while hookscripts run (pre-start and post-start both run
# inside vm_start, under lock_config), so `pct set` (which takes the same lock) would wait for it and
# time out. This script runs inside that locked section, as a child of the lock holder, and writes
# the config with PVE's own PVE::LXC::Config->write_config - the start task itself writes nothing
# after these phases. Key and caps are therefore published before the start task ends.
#
# Fail closed: any error exits non-zero, which aborts the start in pre-start (the runtime then
# destroys the CT); in post-start nothing is published and the runtime refuses the CT.

use strict;
use warnings;

use Fcntl qw(O_WRONLY O_CREAT O_EXCL O_NOFOLLOW S_ISDIR S_ISBLK :flock);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use POSIX ();

use PVE::LXC;
use PVE::LXC::CGroup;
use PVE::LXC::Config;
use PVE::Storage;

my $PREFIX = 'sandbox-rt-ssh-host-key: ';
my $CAPS_PREFIX = 'sandbox-rt-caps: ';
my $APPLIED_PREFIX = 'sandbox-rt-caps-applied: ';
my $KEY = '/etc/ssh/ssh_host_ed25519_key';
# The node's ceilings (the role writes the file; SANDBOX_RT_HOOKSCRIPT_CONF only for tests).
my $CEILINGS_FILE = $ENV{SANDBOX_RT_HOOKSCRIPT_CONF} // '/etc/sandbox_rt/pve-hookscript.conf';
# Without the file: the role's defaults (roles/proxmox_hookscript/defaults/main.yml).
my %CEILING_DEFAULTS = (pids_max => 65536, disk_mbps => 10000, disk_iops => 1000000);
my @CAPS = qw(pids_max disk_mbps disk_iops);
my $REFUSED_PREFIX = 'sandbox-rt-caps-refused: ';
# sandbox_rt/caps.py PID_RESERVE_FRACTION: the node keeps 1/8 of pid_max for itself (a unit test
# holds the two equal).
my $PID_RESERVE_FRACTION = 8;
my $PIDS_LOCK = $ENV{SANDBOX_RT_HOOKSCRIPT_PIDS_LOCK} // '/run/sandbox-rt-hookscript-pids.lock';

my ($vmid, $phase) = @ARGV;
die "usage: $0 <vmid> <phase>\n" if !defined($phase) || $vmid !~ m/^\d+$/;

sub slurp {
    my ($path) = @_;
    open(my $fh, '<', $path) or die "cannot read $path: $!\n";
    local $/;
    my $data = <$fh>;
    close($fh);
    return $data;
}

sub description_lines {
    my ($conf) = @_;
    return split(/\n/, $conf->{description} // '');
}

# The description without the lines starting with $prefix, plus @add (one line each).
sub set_lines {
    my ($conf, $prefix, @add) = @_;
    my @kept = grep { index($_, $prefix) != 0 } description_lines($conf);
    $conf->{description} = join("\n", @kept, @add) . "\n";
}

if ($phase eq 'pre-start') {
    pre_start();
} elsif ($phase eq 'post-start') {
    post_start();
}
exit(0);

# -- pre-start: the host key ---------------------------------------------------------------------

sub pre_start {
    my $conf = PVE::LXC::Config->load_config($vmid);
    # a former start's caps (applied or refused) say nothing about this one
    if (grep { index($_, $APPLIED_PREFIX) == 0 || index($_, $REFUSED_PREFIX) == 0 } description_lines($conf)) {
        set_lines($conf, $APPLIED_PREFIX);
        set_lines($conf, $REFUSED_PREFIX);
        PVE::LXC::Config->write_config($vmid, $conf);
    }
    return if grep { index($_, $PREFIX) == 0 } description_lines($conf); # key and line exist

    # One fresh ed25519 key, generated on the host into a private temporary directory.
    my $hostname = $conf->{hostname} // "CT$vmid";
    $hostname =~ s/[^A-Za-z0-9.-]//g;
    my $tmp = tempdir('sandbox-rt-hostkey-XXXXXX', TMPDIR => 1, CLEANUP => 1);
    system('ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', "root\@$hostname", '-f', "$tmp/key") == 0
        or die "sandbox-rt hookscript: ssh-keygen failed for CT $vmid\n";
    my $private = slurp("$tmp/key");
    my $public = slurp("$tmp/key.pub");
    chomp($public);

    my $storecfg = PVE::Storage::config();
    my (undef, $root_uid, $root_gid) = PVE::LXC::parse_id_maps($conf);
    my $rootdir = PVE::LXC::mount_all($vmid, $storecfg, $conf);
    eval { write_keys($rootdir, $root_uid, $root_gid, $private, $public) };
    my $err = $@;
    PVE::LXC::umount_all($vmid, $storecfg, $conf, $err ? 1 : 0);
    die "sandbox-rt hookscript: $err" if $err;

    # Publish the public half (other description lines, e.g. the runtime's record, are kept).
    $conf = PVE::LXC::Config->load_config($vmid);
    set_lines($conf, $PREFIX, $PREFIX . $public);
    PVE::LXC::Config->write_config($vmid, $conf);
    print "sandbox-rt: published the SSH host key of CT $vmid\n";
}

# Write both halves inside the CT's rootfs: in a child that chroots into it, so symlinks planted
# in the rootfs resolve inside it and never reach the host; existing files are replaced, never
# followed (O_EXCL|O_NOFOLLOW after unlink).
sub write_keys {
    my ($rootdir, $uid, $gid, $private, $public) = @_;
    my $pid = fork() // die "fork failed: $!\n";
    if ($pid == 0) {
        my $ok = eval {
            chroot($rootdir) or die "chroot $rootdir: $!\n";
            chdir('/') or die "chdir /: $!\n";
            for my $dir ('/etc', '/etc/ssh') {
                my @st = lstat($dir) or die "$dir is missing in the CT\n";
                die "$dir is not a directory in the CT\n" if !S_ISDIR($st[2]);
            }
            for my $file ([$KEY, $private, 0600], ["$KEY.pub", "$public\n", 0644]) {
                my ($path, $data, $mode) = @$file;
                unlink($path) or $!{ENOENT} or die "cannot remove $path: $!\n";
                sysopen(my $fh, $path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600)
                    or die "cannot create $path: $!\n";
                print {$fh} $data or die "cannot write $path: $!\n";
                chown($uid, $gid, $fh) or die "cannot chown $path: $!\n";
                chmod($mode, $fh) or die "cannot chmod $path: $!\n";
                close($fh) or die "cannot close $path: $!\n";
            }
            1;
        };
        print STDERR $@ if !$ok;
        POSIX::_exit($ok ? 0 : 1);
    }
    waitpid($pid, 0);
    die "writing the host key into CT $vmid failed\n" if $? != 0;
}

# -- post-start: the caps ------------------------------------------------------------------------

# The node's ceilings: "name = <digits>" lines (# comments); unknown names or other values die.
sub ceilings {
    my %ceil = %CEILING_DEFAULTS;
    return \%ceil if !-e $CEILINGS_FILE;
    for my $line (split(/\n/, slurp($CEILINGS_FILE))) {
        next if $line =~ m/^\s*(?:#.*)?$/;
        my ($name, $value) = $line =~ m/^\s*([a-z_]+)\s*=\s*(\d{1,9})\s*$/
            or die "$CEILINGS_FILE: cannot parse '$line'\n";
        die "$CEILINGS_FILE: unknown ceiling '$name'\n" if !exists($ceil{$name});
        $ceil{$name} = int($value);
    }
    die "$CEILINGS_FILE: pids_max must be at least 1\n" if $ceil{pids_max} < 1;
    return \%ceil;
}

# What the runtime asked for (the description's caps line); a missing line asks for the ceilings.
sub requested {
    my ($conf) = @_;
    my @lines = grep { index($_, $CAPS_PREFIX) == 0 } description_lines($conf);
    return { map { $_ => 0 } @CAPS } if !@lines;
    die "CT $vmid: more than one caps line\n" if @lines > 1;
    my $text = substr($lines[0], length($CAPS_PREFIX));
    my ($p, $m, $i) = $text =~ m/^pids_max=(\d{1,9}) disk_mbps=(\d{1,9}) disk_iops=(\d{1,9})\s*$/
        or die "CT $vmid: malformed caps line '$text'\n";
    return { pids_max => int($p), disk_mbps => int($m), disk_iops => int($i) };
}

# Each cap bounded by the node: 0 (none asked) and values above a ceiling become the ceiling; a
# ceiling of 0 (disk only) sets none.
sub effective {
    my ($want, $ceil) = @_;
    my %eff;
    for my $name (@CAPS) {
        my ($w, $c) = ($want->{$name}, $ceil->{$name});
        $eff{$name} = ($c > 0 && ($w == 0 || $w > $c)) ? $c : $w;
    }
    return \%eff;
}

# major:minor of a block device: a partition's parent disk (the kernel throttles whole disks only).
sub whole_disk {
    my ($major, $minor) = @_;
    my $dev = "$major:$minor";
    if (-e "/sys/dev/block/$dev/partition") {
        my $parent = slurp("/sys/dev/block/$dev/../dev");
        chomp($parent);
        die "CT $vmid: no parent disk of partition $dev\n" if $parent !~ m/^\d+:\d+$/;
        return $parent;
    }
    return $dev;
}

# The block device that holds the CT's rootfs: the device of the running CT's root (a volume's own
# device: lvm, rbd, a raw image's loop), else of the rootfs volume's path (a subvolume directory).
# Neither (zfs, btrfs and overlay report device 0:x): none, and disk caps cannot be enforced.
sub rootfs_device {
    my ($conf, $pid) = @_;
    my @candidates = ("/proc/$pid/root");
    my $volid = eval { PVE::LXC::Config->parse_volume('rootfs', $conf->{rootfs})->{volume} };
    if (defined($volid)) {
        my $path = eval { PVE::Storage::path(PVE::Storage::config(), $volid) };
        push @candidates, $path if defined($path);
    }
    for my $path (@candidates) {
        my @st = stat($path) or next;
        my $dev = S_ISBLK($st[2]) ? $st[6] : $st[0];
        my ($major, $minor) = (($dev >> 8) & 0xfff, ($dev & 0xff) | (($dev >> 12) & 0xfff00));
        return whole_disk($major, $minor) if $major != 0;
    }
    return undef;
}

sub write_file {
    my ($path, $value) = @_;
    open(my $fh, '>', $path) or die "cannot open $path: $!\n";
    print {$fh} "$value\n" or die "cannot write '$value' to $path: $!\n";
    close($fh) or die "cannot write '$value' to $path: $!\n";
}

sub post_start {
    my $conf = PVE::LXC::Config->load_config($vmid);
    my $eff = effective(requested($conf), ceilings());
    my $pid = PVE::LXC::find_lxc_pid($vmid) or die "CT $vmid is not running\n";
    my $cgroup = PVE::LXC::CGroup->new($vmid);

    my ($pids, undef) = $cgroup->get_path('pids', 1);
    die "CT $vmid: no pids cgroup\n" if !defined($pids);
    my $lock = pids_budget_lock(); # held until this script exits
    check_pids_budget($pids, $eff->{pids_max});
    write_file("$pids/pids.max", $eff->{pids_max});
    my $now = slurp("$pids/pids.max");
    chomp($now);
    die "CT $vmid: pids.max is '$now', not $eff->{pids_max}\n" if $now ne $eff->{pids_max};

    my $device = '-';
    my ($bps, $iops) = ($eff->{disk_mbps} * 1024 * 1024, $eff->{disk_iops});
    if ($bps || $iops) {
        $device = rootfs_device($conf, $pid)
            // die "CT $vmid: no block device holds its rootfs ($conf->{rootfs}): disk caps cannot hold\n";
        my ($io, $ver) = $cgroup->get_any_path(1, 'io', 'blkio');
        die "CT $vmid: no io/blkio cgroup\n" if !defined($io);
        if ($ver == 2) {
            my ($b, $i) = ($bps || 'max', $iops || 'max');
            my $line = "$device rbps=$b wbps=$b riops=$i wiops=$i";
            write_file("$io/io.max", $line);
            my @now = grep { index($_, "$device ") == 0 } split(/\n/, slurp("$io/io.max"));
            die "CT $vmid: io.max is '@now', not '$line'\n" if "@now" ne $line;
        } else {
            my %want = (read_bps_device => $bps, write_bps_device => $bps,
                        read_iops_device => $iops, write_iops_device => $iops);
            for my $name (sort keys %want) {
                my $file = "$io/blkio.throttle.$name";
                write_file($file, "$device $want{$name}");
                my @now = grep { index($_, "$device ") == 0 } split(/\n/, slurp($file));
                my $expect = $want{$name} ? "$device $want{$name}" : '';
                die "CT $vmid: $file is '@now', not '$expect'\n" if "@now" ne $expect;
            }
        }
    }

    my $applied = join(' ', (map { "$_=$eff->{$_}" } @CAPS), "device=$device");
    $conf = PVE::LXC::Config->load_config($vmid);
    set_lines($conf, $APPLIED_PREFIX, $APPLIED_PREFIX . $applied);
    PVE::LXC::Config->write_config($vmid, $conf);
    print "sandbox-rt: CT $vmid caps $applied\n";
}

# -- the node's pids budget ------------------------------------------------------------------------

sub pids_budget_lock {
    open(my $fh, '>>', $PIDS_LOCK) or die "cannot open $PIDS_LOCK: $!\n";
    flock($fh, LOCK_EX) or die "cannot lock $PIDS_LOCK: $!\n";
    return $fh;
}

# The pids limits the other CTs of this node hold: the numeric pids.max of each sibling of this CT's
# limiting cgroup (a CT without a limit, "max", cannot be budgeted and is not counted).
sub pids_taken {
    my ($own) = @_;
    my $parent = dirname($own);
    opendir(my $dh, $parent) or die "cannot list $parent: $!\n";
    my $taken = 0;
    for my $entry (readdir($dh)) {
        next if $entry eq '.' || $entry eq '..';
        my $dir = "$parent/$entry";
        next if $dir eq $own || -l $dir || !-d $dir || !-f "$dir/pids.max";
        my $value = eval { slurp("$dir/pids.max") } // next;
        chomp($value);
        $taken += $value if $value =~ m/^\d{1,10}$/;
    }
    closedir($dh);
    return $taken;
}

sub check_pids_budget {
    my ($own, $want) = @_;
    my $pid_max = slurp('/proc/sys/kernel/pid_max');
    chomp($pid_max);
    die "CT $vmid: kernel.pid_max is '$pid_max'\n" if $pid_max !~ m/^\d+$/;
    my $budget = $pid_max - int($pid_max / $PID_RESERVE_FRACTION);
    my $taken = pids_taken($own);
    return if $taken + $want <= $budget;
    my $why = "pids budget: the node's CTs hold $taken of $budget pids (kernel.pid_max=$pid_max less its "
        . "reserve), pids_max=$want does not fit; destroy sandboxes or ask for a smaller pids_max";
    my $conf = PVE::LXC::Config->load_config($vmid);
    set_lines($conf, $REFUSED_PREFIX, $REFUSED_PREFIX . $why);
    PVE::LXC::Config->write_config($vmid, $conf);
    die "CT $vmid: $why\n";
}
