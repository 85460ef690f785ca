#!/usr/bin/perl
# sandbox_rt host-key hookscript for Proxmox VE containers.
#
# Installed by the proxmox_hookscript role as <snippets dir>/sandbox-rt-hookscript.pl and set on the
# sandbox template (root@pam only):  pct set <template vmid> --hookscript local:snippets/sandbox-rt-hookscript.pl
# Linked clones inherit the option, so every sandbox runs it.
#
# pre-start: if the CT's description has no "sandbox-rt-ssh-host-key:" line (a fresh clone), generate
# one ed25519 host key, write it into the CT's root filesystem as /etc/ssh/ssh_host_ed25519_key{,.pub}
# (owned by the CT's mapped root, 0600/0644), and publish the public half as that line of the
# description. The runtime reads the line after the start task ended OK and pins it before its first
# SSH contact (docs/proxmox.md, tests/pve_server/hostkey.py). A restart keeps key and line.
#
# The start task holds the CT's config lock while hookscripts run, so `pct set` (which takes the same
# lock) would wait for it and time out. This script runs inside that locked section, as a child of
# the lock holder, and writes the config with PVE's own PVE::LXC::Config->write_config - the start
# task itself writes nothing after this phase. The key is therefore published before the start
# task ends.
#
# Fail closed: any error exits non-zero, which aborts the start (the runtime then destroys the CT).

use strict;
use warnings;

use Fcntl qw(O_WRONLY O_CREAT O_EXCL O_NOFOLLOW S_ISDIR);
use File::Temp qw(tempdir);
use POSIX ();

use PVE::LXC;
use PVE::LXC::Config;
use PVE::Storage;

my $PREFIX = 'sandbox-rt-ssh-host-key: ';
my $KEY = '/etc/ssh/ssh_host_ed25519_key';

my ($vmid, $phase) = @ARGV;
die "usage: $0 <vmid> <phase>\n" if !defined($phase) || $vmid !~ m/^\d+$/;
exit(0) if $phase ne 'pre-start';

my $conf = PVE::LXC::Config->load_config($vmid);
my $description = $conf->{description} // '';
my @lines = split(/\n/, $description);
if (grep { index($_, $PREFIX) == 0 } @lines) {
    exit(0); # key and line exist since the first start
}

sub slurp {
    my ($path) = @_;
    open(my $fh, '<', $path) or die "cannot read $path: $!\n";
    local $/;
    my $data = <$fh>;
    close($fh);
    return $data;
}

# One fresh ed25519 key, generated on the host into a private temporary directory.
my $hostname = $conf->{hostname} // "CT$vmid";
$hostname =~ s/[^A-Za-z0-9.-]//g;
my $tmp = tempdir('sandbox-rt-hostkey-XXXXXX', TMPDIR => 1, CLEANUP => 1);
system('ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', "root\@$hostname", '-f', "$tmp/key") == 0
    or die "sandbox-rt hookscript: ssh-keygen failed for CT $vmid\n";
my $private = slurp("$tmp/key");
my $public = slurp("$tmp/key.pub");
chomp($public);

# Write both halves inside the CT's rootfs: in a child that chroots into it, so symlinks planted
# in the rootfs resolve inside it and never reach the host; existing files are replaced, never
# followed (O_EXCL|O_NOFOLLOW after unlink).
sub write_keys {
    my ($rootdir, $uid, $gid) = @_;
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

my $storecfg = PVE::Storage::config();
my (undef, $root_uid, $root_gid) = PVE::LXC::parse_id_maps($conf);
my $rootdir = PVE::LXC::mount_all($vmid, $storecfg, $conf);
eval { write_keys($rootdir, $root_uid, $root_gid) };
my $err = $@;
PVE::LXC::umount_all($vmid, $storecfg, $conf, $err ? 1 : 0);
die "sandbox-rt hookscript: $err" if $err;

# Publish the public half (other description lines, e.g. the runtime's record, are kept).
$conf = PVE::LXC::Config->load_config($vmid);
my @kept = grep { index($_, $PREFIX) != 0 } split(/\n/, $conf->{description} // '');
$conf->{description} = join("\n", @kept, $PREFIX . $public) . "\n";
PVE::LXC::Config->write_config($vmid, $conf);
print "sandbox-rt: published the SSH host key of CT $vmid\n";
exit(0);
