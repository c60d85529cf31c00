package admin

// RestrictSocket is the last step of ListenUnix, exposed so that a test can
// replace the socket with a symlink right before it: the race a test cannot
// win against ListenUnix itself.
var RestrictSocket = restrictSocket
