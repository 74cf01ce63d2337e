// A figure linked to its own file opens full size in the browser. MyST turns a link to a local
// file into a download link (the attribute "download"), which saves the PNG instead of showing it,
// and the theme marks such a link with a download icon, a line of its own above the figure.
document.addEventListener('DOMContentLoaded', () => {
  document.querySelectorAll('a[download]').forEach(link => {
    const image = link.querySelector('img');
    if (image) {
      link.removeAttribute('download');
      link.classList.remove('download');  // the theme's download icon drawn above the figure
      link.href = image.getAttribute('src');
    }
  });
});
